"""Summary table, confidence intervals and figures from a results file."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from layerfusion_recipes.core.results.stats import excludes_zero, mean_ci
from layerfusion_recipes.reporting import plot
from layerfusion_recipes.reporting.plot import (
    cell_text,
    markdown_table,
    paired_differences,
    paired_table,
    score_groups,
    summarize,
    write_report,
)
from peft_layerfusion.registration import TRAINED_METHODS


def test_mean_ci_uses_student_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-3)  # t(0.975, 2) = 4.303
    assert mean_ci([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError):
        mean_ci([])


def test_a_difference_is_resolved_only_when_its_interval_excludes_zero():
    assert excludes_zero(-5.5, 1.2, 3) and excludes_zero(0.5, 0.4, 2)
    assert not excludes_zero(2.0, 2.0, 3)  # the interval touches 0
    assert not excludes_zero(2.0, 0.0, 1)  # one pair: no interval


def test_the_paired_methods_derive_from_the_registry(monkeypatch):
    assert plot.method_pairs() == (
        ("dwatt", "extra_layers"),
        ("concat", "extra_layers"),
        ("scaled_dwatt", "extra_layers"),
        ("dwatt", "concat"),
        ("dwatt", "scaled_dwatt"),
        ("concat", "scaled_dwatt"),
        ("dwatt", "none"),
        ("concat", "none"),
        ("scaled_dwatt", "none"),
        ("average", "extra_layers"),
        ("scalar_mix", "extra_layers"),
        ("layer_mix", "extra_layers"),
        ("layer_mix", "none"),
    )
    # a newly registered method sized to the budget is paired without touching plot.py
    new = SimpleNamespace(name="new", token_wise=True, module_cls=SimpleNamespace(sized_to_budget=True))
    monkeypatch.setattr(plot, "TRAINED_METHODS", (*TRAINED_METHODS, new))
    pairs = plot.method_pairs()
    assert {("new", "extra_layers"), ("dwatt", "new"), ("concat", "new"), ("new", "none")} <= set(pairs)


def _record(method: str, shots: int, trial: int, top: float, key_suffix: str = "", **fields) -> dict:
    """A finished FE run of ``method`` (5 epochs, a dev curve rising to ``top``; DWAtt's with its depth
    attention over 3 layers), ``fields`` added."""
    record = {
        "key": f"{method}|fe|{shots}|5|{trial}{key_suffix}",
        **{"method": method, "regime": "fe", "shots": shots, "epochs": 5, "trial": trial},
        **{"task": "ner", "setup": "s"},
        **fields,
        "curve": [{"epoch": e, "step": 3 * e, "dev_f1": top * e / 5} for e in range(1, 6)],
    }
    if method == "dwatt":
        record |= {"depth_attention": [0.2, 0.3, 0.5], "fused_layers": [1, 2, 3]}
    return record


def _records():
    return [
        _record(method, shots, trial, base, dev_f1=base + noise + shots / 100)
        for method, base in (("none", 0.4), ("dwatt", 0.6))
        for shots in (2, 4)
        for trial, noise in enumerate((-0.1, 0.0, 0.1))
    ]


def test_summarize_and_table_numbers():
    rows = summarize(_records())
    assert [(r["method"], r["shots"]) for r in rows] == [("none", 2), ("dwatt", 2), ("none", 4), ("dwatt", 4)]
    assert rows[0]["mean"] == pytest.approx(42.0) and rows[0]["n"] == 3
    assert rows[0]["ci"] == pytest.approx(4.303 * 10 / 3**0.5, rel=1e-3)
    table = markdown_table(rows)
    assert "| regime | epochs | shots | none | dwatt |" in table
    assert "| fe | 5 | 4 | 44.0 ± 24.8 (n=3) | 64.0 ± 24.8 (n=3) |" in table


def test_table_columns_follow_the_registry_whatever_cell_comes_first():
    records = [r for r in _records() if (r["method"], r["shots"]) != ("none", 2)]  # N=2: dwatt alone
    table = markdown_table(summarize(records))
    assert "| regime | epochs | shots | none | dwatt |" in table
    assert "| fe | 5 | 2 | - | 62.0 ± 24.8 (n=3) |" in table


def test_write_report_writes_pngs(tmp_path):
    previous = os.umask(0o022)
    try:
        paths = write_report(_records(), tmp_path)
    finally:
        os.umask(previous)
    for path in paths.values():  # others may read the results (mkstemp alone gives 0600)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert set(paths) == {"table", "f1_vs_shots", "dev_curves", "dwatt_attention"}
    for name in ("f1_vs_shots", "dev_curves", "dwatt_attention"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[name].stat().st_size > 5000
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("tmp*"))
    no_dwatt = [r for r in _records() if r["method"] == "none"]
    assert "dwatt_attention" not in write_report(no_dwatt, tmp_path / "b")


def test_paired_differences_use_each_method_at_its_selected_lr():
    records = []
    runs = (("dwatt", 1e-2, (0.60, 0.70, 0.65)), ("none", 1e-3, (0.40, 0.45, 0.55)))
    for method, good_lr, test_scores in runs:
        for lr in (1e-3, 1e-2):
            for trial, test in enumerate(test_scores):
                chosen = lr == good_lr
                records.append({
                    "key": f"{method}|{lr}|{trial}", "setup": "s", "method": method, "regime": "fe",
                    "shots": 8, "epochs": 5, "trial": trial, "lr": lr,
                    "dev_f1": 0.9 if chosen else 0.1, "test_f1": test if chosen else 0.0,
                })  # fmt: skip
    differences = paired_differences(records, summarize(records))
    (dwatt_none,) = [d for d in differences if d["pair"] == ("dwatt", "none")]
    mean, half = mean_ci([20.0, 25.0, 10.0])  # (60-40, 70-45, 65-55) in points
    assert dwatt_none["n"] == 3 and dwatt_none["mean"] == pytest.approx(mean)
    assert dwatt_none["ci"] == pytest.approx(half)
    assert "| fe | 5 | 8 | +18.3 ± 19.0 |" in paired_table(differences)  # CI wider than the mean: not bold
    one_trial = [r for r in records if r["trial"] == 0]
    table = paired_table(paired_differences(one_trial, summarize(one_trial)))
    assert "| fe | 5 | 8 | +20.0 (n=1) |" in table and "±" not in table.split("\n\n")[0]  # no interval


def test_a_cell_reports_test_f1_only_where_every_run_at_its_lr_has_one():
    cell = {"setup": "s", "regime": "fe", "epochs": 5, "shots": 8, "method": "dwatt", "lr": 1e-3}
    cell["dev_f1"] = 0.6
    runs = [{**cell, "key": "a", "trial": 0}, {**cell, "key": "b", "trial": 1, "test_f1": 0.5}]
    (group,) = score_groups(runs).values()
    assert group.stats["test"] is None and group.values["dev"] == {0: 60.0, 1: 60.0}
    assert (summarize(runs)[0]["score"], summarize(runs)[0]["mean"]) == ("dev", 60.0)
    assert (summarize(runs[1:])[0]["score"], summarize(runs[1:])[0]["mean"]) == ("test", 50.0)


def test_a_cell_of_one_trial_claims_no_interval():
    row = {"mean": 46.0, "ci": 0.0, "lr": 3e-4, "edge": False, "score": "test", "dev_mean": 57.1}
    assert cell_text({**row, "n": 1}) == "46.0 @0.0003 (dev 57.1) (n=1)"
    assert cell_text({**row, "n": 2}) == "46.0 ± 0.0 @0.0003 (dev 57.1) (n=2)"


def test_a_setup_column_only_where_one_group_mixes_setups():
    """Languages differ in setup (the language is part of it): that alone adds no setup column."""
    rows = []
    for language, setup in (("en", "s-en"), ("de", "s-de")):
        rows += [{**row, "setup": setup, "language": language} for row in summarize(_records())]
    header = markdown_table(rows, lead=("language",)).splitlines()[0]
    assert header.startswith("| language | regime |")
    rows.append({**rows[0], "setup": "s-en-other"})
    assert markdown_table(rows, lead=("language",)).splitlines()[0].startswith("| language | setup |")


def _lr_records(methods=("dwatt", "extra_layers", "none", "concat")) -> list[dict]:
    """Cells of several methods at 3 LRs, 3 trials, 2 shot sizes; written with DWAtt first. The
    methods score nearly alike (their LR labels meet at one point) and low (their bands reach below 0)."""
    records = []
    for method in methods:
        for shots in (2, 8):
            for lr in (1e-3, 1e-2, 1e-1):
                for trial, f1 in enumerate((0.0, 0.02, 0.12)):
                    score = f1 + shots / 400 + (lr == 1e-2) * 0.01
                    fields = {"lr": lr, "setup": "s", "dev_f1": score, "test_f1": score}
                    records.append(_record(method, shots, trial, score, f"|lr={lr!r}|s", **fields))
    return records


def _saved_figures(monkeypatch, records: list[dict], directory) -> dict:
    """The figures :func:`write_report` draws from ``records`` into ``directory``, by file name."""
    saved = {}
    original = plot._save

    def keep(figure, path):
        saved[path.stem] = figure
        return original(figure, path)

    monkeypatch.setattr(plot, "_save", keep)
    write_report(records, directory)
    return saved


@pytest.fixture
def figures(monkeypatch, tmp_path):
    """The figures :func:`write_report` draws, by file name (captured as they are saved)."""
    saved = _saved_figures(monkeypatch, _lr_records(), tmp_path)
    for figure in saved.values():
        figure.canvas.draw()  # text and legend positions
    return saved


def test_every_figure_draws_a_method_in_its_one_registry_colour(figures):
    from matplotlib.colors import to_hex

    assert set(figures) == {"f1_vs_shots", "f1_vs_lr", "dev_curves", "dwatt_attention"}
    colours: dict[str, set[str]] = {}
    for name in ("f1_vs_shots", "f1_vs_lr", "dev_curves"):
        for ax in figures[name].axes:
            for line in ax.get_lines():
                if not line.get_label().startswith("_"):
                    colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    methods = ("none", "dwatt", "concat", "extra_layers")  # each under its registry label
    assert colours == {plot.method_label(m): {to_hex(plot.method_color(m))} for m in methods}
    assert set(colours) == {"last layer (plain head)", "DWAtt", "Concat", "R+n"}
    assert [plot.method_color(m) for m in plot.TRAINED_NAMES] == [
        f"C{i}" for i in range(len(plot.TRAINED_NAMES))
    ]


def test_legends_sit_beside_the_panels_never_over_a_line(figures):
    for name in ("f1_vs_shots", "f1_vs_lr", "dev_curves"):
        legends = [ax.get_legend() for ax in figures[name].axes if ax.get_legend() is not None]
        assert len(legends) == 1, name
        box = legends[0].get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in figures[name].axes), name


def test_ci_bands_stay_within_0_and_100_f1(figures):
    from matplotlib.collections import PolyCollection

    bands = [c for ax in figures["f1_vs_shots"].axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 4
    lows = [path.vertices[:, 1].min() for band in bands for path in band.get_paths()]
    assert min(lows) == 0.0  # the t-CI of (0, 2, 12) F1 reaches below 0: clipped there


def test_a_method_of_one_shot_size_gets_an_error_bar_within_0_and_100(monkeypatch, tmp_path):
    from matplotlib.collections import LineCollection

    saved = {}
    monkeypatch.setattr(plot, "_save", lambda figure, path: saved.setdefault(path.stem, figure) and path)
    write_report([r for r in _lr_records(("dwatt",)) if r["shots"] == 2], tmp_path)
    (ax,) = saved["f1_vs_shots"].axes
    (bar,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    (segment,) = bar.get_segments()
    assert segment[0][1] == 0.0 and 0 < segment[1][1] < 100  # (2, 2, 12) + 0.5 points: clipped at 0


def test_lr_labels_of_one_point_do_not_overlap(figures):
    (ax,) = figures["f1_vs_shots"].axes
    texts = ax.texts
    assert len(texts) == 8 and {t.get_text() for t in texts} == {"0.01"}  # 4 methods x 2 shot sizes
    boxes = [t.get_window_extent() for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_axes_and_colour_bar_say_what_they_show_and_fit(figures):
    assert figures["f1_vs_shots"].axes[0].get_ylabel() == "test micro-F1 (%)\nmean ± 95% CI over trials"
    assert figures["dev_curves"].axes[0].get_ylabel() == "dev micro-F1 (%)\nselected LR, mean over trials"
    assert figures["f1_vs_lr"].axes[0].get_ylabel().startswith("micro-F1 (%)")
    for name in ("f1_vs_shots", "f1_vs_lr", "dev_curves"):  # no taller than its panel
        ax = figures[name].axes[0]
        assert ax.yaxis.label.get_window_extent().height <= ax.get_window_extent().height, name
    heatmap, colour_bar = figures["dwatt_attention"].axes  # 3 fused layers: a narrow heatmap
    assert heatmap.get_xlabel() == "fused layer"
    assert colour_bar.get_ylabel().startswith("mean attention weight")
    assert not heatmap.title.get_window_extent().overlaps(colour_bar.yaxis.label.get_window_extent())


def _write_lines(path, entries) -> None:
    import json

    text = (entry if isinstance(entry, str) else json.dumps(entry) for entry in entries)
    path.write_text("".join(line + "\n" for line in text))


def test_plot_of_a_corrupt_results_file_skips_its_bad_lines_in_one_warning(tmp_path, capsys):
    from layerfusion_recipes.cli import main

    path = tmp_path / "results.jsonl"
    good = _records()
    _write_lines(path, [good[0], {"key": 5}, "not json", {"key": "x"}, *good[1:], '{"key": "torn", "re'])
    assert main(["plot", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    n = len(good) + 4
    assert err == [
        f"layerfusion: warning: {path}:2,3,4,{n}: skipped 4 lines that are not complete records "
        "(torn, not JSON, or missing fields)"
    ]
    assert (tmp_path / "f1_vs_shots.png").stat().st_size > 0


def test_plot_refuses_a_file_of_several_tasks_or_of_another_task_in_one_line(tmp_path, capsys):
    from layerfusion_recipes.cli import main

    mixed, mlm = tmp_path / "mixed.jsonl", tmp_path / "mlm.jsonl"
    classify = {**_record("none", 2, 0, 0.5, "|c"), "task": "classify", "metric": "accuracy"}
    _write_lines(mixed, [*_records(), classify])
    _write_lines(mlm, [{"key": "dwatt|fe|0|lr=0.001|s", "settings": {}, "dev_ppl": 20.0, "test_ppl": 21.0}])
    assert main(["plot", str(mixed)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"layerfusion plot: error: {mixed} holds records of ner (12 records), classify (1 record): a results "
        "file holds one task's records; give each task its own --output"
    ]
    assert main(["plot", str(mlm)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"layerfusion plot: error: {mlm} holds records of mlm (1 record): tables and figures are drawn from "
        "a sweep's records, a grid of cells (layerfusion ner, sweep, classify)"
    ]


def test_titles_and_legends_name_methods_and_regimes_as_the_registry_labels_them(figures):
    for name in ("f1_vs_shots", "f1_vs_lr", "dev_curves"):
        axes = figures[name].axes
        legend = next(ax.get_legend() for ax in axes if ax.get_legend() is not None)
        assert [t.get_text() for t in legend.get_texts()] == [
            "last layer (plain head)",
            "DWAtt",
            "Concat",
            "R+n",
        ]
        assert all(ax.get_title().startswith("frozen encoder, ") for ax in axes), name
    heatmap = figures["dwatt_attention"].axes[0]
    assert [t.get_text() for t in heatmap.get_yticklabels()] == [
        "DWAtt: frozen encoder N=2 ep=5",
        "DWAtt: frozen encoder N=8 ep=5",
    ]


def test_the_depth_attention_of_each_method_is_its_own_row(monkeypatch, tmp_path):
    """DWAtt and Scaled DWAtt in one file: one row each, each the mean of its own trials only."""
    saved = {}
    monkeypatch.setattr(plot, "_save", lambda figure, path: saved.setdefault(path.stem, figure) and path)
    records = []
    for method, first in (("dwatt", 0.9), ("scaled_dwatt", 0.3)):
        for trial, shift in enumerate((-0.1, 0.1)):
            record = _record(method, 2, trial, 0.5, dev_f1=0.5, test_f1=0.4)
            attention = [first + shift, 0.1, 0.9 - first - shift]
            records.append({**record, "depth_attention": attention, "fused_layers": [1, 2, 3]})
    write_report(records, tmp_path)
    heatmap = saved["dwatt_attention"].axes[0]
    assert [t.get_text() for t in heatmap.get_yticklabels()] == [
        "DWAtt: frozen encoder N=2 ep=5",
        "Scaled DWAtt: frozen encoder N=2 ep=5",
    ]
    rows = heatmap.get_images()[0].get_array().tolist()
    assert rows[0] == pytest.approx([0.9, 0.1, 0.0]) and rows[1] == pytest.approx([0.3, 0.1, 0.6])
    again = [{**r, "setup": "t", "key": r["key"] + "|t"} for r in records if r["method"] == "dwatt"]
    saved.clear()
    write_report(records + again, tmp_path / "again")  # a second setup: its own rows, named as reports do
    assert [t.get_text() for t in saved["dwatt_attention"].axes[0].get_yticklabels()] == [
        "DWAtt: frozen encoder N=2 ep=5 (setup s)",
        "DWAtt: frozen encoder N=2 ep=5 (setup t)",
        "Scaled DWAtt: frozen encoder N=2 ep=5 (setup s)",
    ]


def test_dev_curves_of_runs_with_one_dev_evaluation_draw_their_points(monkeypatch, tmp_path):
    saved = {}
    monkeypatch.setattr(plot, "_save", lambda figure, path: saved.setdefault(path.stem, figure) and path)
    records = [{**record, "curve": record["curve"][-1:]} for record in _records()]  # dev once, at the end
    write_report(records, tmp_path)
    for ax in saved["dev_curves"].axes:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert len(lines) == 2 and all(
            len(line.get_xdata()) == 1 and line.get_marker() == "o" for line in lines
        )
        assert [tick.get_text() for tick in ax.get_xticklabels()] == ["15"]  # its step, none between


def test_lr_labels_at_close_shot_sizes_cover_no_other_label_and_no_point(monkeypatch, tmp_path):
    """N = 1 .. 6 sit close on the log axis, the LR labels long (edge): none covers another or a point."""
    saved = {}
    monkeypatch.setattr(plot, "_save", lambda figure, path: saved.setdefault(path.stem, figure) and path)
    records = []
    for method, base in (("none", 0.40), ("dwatt", 0.45), ("concat", 0.43), ("extra_layers", 0.42)):
        for shots in range(1, 7):
            for lr in (1e-3, 1e-2):
                chosen = lr == (1e-3 if (shots + len(method)) % 2 else 1e-2)  # an edge either way
                for trial in range(2):
                    score = base + shots / 100 + 0.05 * chosen + 0.01 * trial
                    fields = {"lr": lr, "setup": "s", "dev_f1": score, "test_f1": score}
                    records.append(_record(method, shots, trial, score, f"|lr={lr!r}|s", **fields))
    write_report(records, tmp_path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = saved["f1_vs_shots"]
    (ax,) = figure.axes
    renderer = FigureCanvasAgg(figure).get_renderer()  # the figure is closed: draw it again
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert len(boxes) == 24 and all("(edge)" in text.get_text() for text in ax.texts)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    from matplotlib.transforms import Bbox

    radius = 3 * figure.dpi / 72  # a marker of 6 points
    points = [ax.transData.transform(xy) for line in ax.get_lines() for xy in line.get_xydata()]
    markers = [Bbox.from_bounds(x - radius, y - radius, 2 * radius, 2 * radius) for x, y in points]
    assert not any(box.overlaps(marker) for box in boxes for marker in markers)


def test_every_figure_says_what_options_its_runs_were_given(monkeypatch, tmp_path):
    """Lines and legends name a method alone: where the runs were given options (``method_options``,
    ``--probe-fuse``), each figure and ``table.md`` say which, once; without options, none does."""
    captions = {}
    original = plot._save

    def keep(figure, path):
        captions[path.stem] = [text.get_text() for text in figure.texts]
        return original(figure, path)

    monkeypatch.setattr(plot, "_save", keep)
    given = [{**r, "method_options": {"lora_r": 4}} if r["method"] == "dwatt" else r for r in _lr_records()]
    paths = write_report(given, tmp_path / "given")
    line = "Options given to these runs: DWAtt: lora_r=4."
    assert sorted(captions) == ["dev_curves", "dwatt_attention", "f1_vs_lr", "f1_vs_shots"]
    assert all(texts == [line] for texts in captions.values()), captions
    assert paths["table"].read_text().count(line) == 1
    captions.clear()
    paths = write_report(_lr_records(), tmp_path / "plain")
    assert captions and all(texts == [] for texts in captions.values())
    assert "Options given" not in paths["table"].read_text()


def test_runs_of_two_setups_get_their_own_panels_never_one_pooled_line(monkeypatch, tmp_path):
    """A file run again under a new setup (new data, model or settings) holds both setups' runs: each
    figure draws each setup in its own panels, titled with it, and a method's line joins one setup's
    points only."""
    again = [
        {
            **r,
            "setup": "t",
            "key": r["key"].replace("|s", "|t"),
            "dev_f1": r["dev_f1"] + 0.5,
            "curve": [{**point, "dev_f1": point["dev_f1"] + 0.5} for point in r["curve"]],
        }
        for r in _lr_records(("none",))
        if r["shots"] == 8
    ]
    saved = _saved_figures(monkeypatch, _lr_records(("none",)) + again, tmp_path)
    titles = {name: [ax.get_title() for ax in figure.axes] for name, figure in saved.items()}
    assert titles["f1_vs_shots"] == [
        "frozen encoder, max 5 epochs\n(setup s)",
        "frozen encoder, max 5 epochs\n(setup t)",
    ]
    assert titles["f1_vs_lr"][-1] == titles["dev_curves"][-1] == "frozen encoder, 5 epochs, N=8\n(setup t)"
    assert len(titles["f1_vs_lr"]) == len(titles["dev_curves"]) == 3  # s: N=2 and 8; t: N=8
    first, again_line = (ax.get_lines()[0] for ax in saved["f1_vs_shots"].axes)
    assert len(first.get_xdata()) == 2 and len(again_line.get_xdata()) == 1
    assert max(saved["dev_curves"].axes[-1].get_lines()[0].get_ydata()) > 50  # t's curves alone (pooled: 33)
