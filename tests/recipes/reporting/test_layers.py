"""Layer diagnostics (reporting/layers.py, ``--probe-layers``): a toy whose label lives in one layer by
construction is found there; the per-layer choice of feature kind and the learned weights at each cell's
selected LR; the best layers as ``layers=[...]`` fed to every method's config and to a recipe's model;
the figure, the table and the printed subset of ``classify`` and ``ner`` runs, resumed without training
again."""

from __future__ import annotations

import json
import zlib
from functools import partial

import pytest
import torch
from conftest import tiny_bert, write_folders, write_text_data, write_tiny_model, write_toy_data
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex
from peft import get_peft_model

from layerfusion_recipes.classify.experiment import ClassifyExperiment, ClassifySettings
from layerfusion_recipes.classify.settings import resolve
from layerfusion_recipes.cli import build_parser, main
from layerfusion_recipes.core.probes import probes as core_probes
from layerfusion_recipes.core.probes.probes import probe_records
from layerfusion_recipes.core.results.cells import Cell
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps import sweep
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log
from layerfusion_recipes.core.sweeps.tasks import read_task_records
from layerfusion_recipes.reporting import layers as layers_module
from layerfusion_recipes.reporting.layers import (
    best_layers,
    best_layers_lines,
    layer_tick_labels,
    layers_markdown,
    layers_text,
    learned_weights,
    method_color,
    plot_layers,
    probe_rows,
)
from peft_layerfusion.layer import fusion_layer_of
from peft_layerfusion.registration import ENCODER_METHODS

PLANTED = 2  # the layer that holds the label in the toy


class PlantedCache:
    """A feature cache of ``L`` noise states per token, except at the first token of layer
    :data:`PLANTED`, whose first ``C`` dimensions add the one-hot label: only that layer tells the class."""

    def __init__(self, num_blocks: int = 4, width: int = 8, classes: int = 3) -> None:
        self.num_blocks, self.located = num_blocks, None  # as FeatureCache once its encoder is released
        self.width, self.classes = width, classes

    def fill(self, features) -> int:
        return 0

    def batch_states(self, features) -> torch.Tensor:
        seq = max(len(f["input_ids"]) for f in features)
        out = torch.zeros(self.num_blocks, len(features), seq, self.width)  # (L, batch, seq, d)
        for row, feature in enumerate(features):
            seed = zlib.crc32(str(feature["input_ids"]).encode())  # the same states every time
            noise = torch.randn(
                self.num_blocks, seq, self.width, generator=torch.Generator().manual_seed(seed)
            )
            out[:, row] = noise
            out[PLANTED - 1, row, 0, feature["labels"]] += 5.0
        return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_folders(
        tmp_path_factory,
        model=partial(write_tiny_model, layers=3),
        texts=partial(write_text_data, sizes=(("train", 30), ("dev", 15), ("test", 15))),
        ner=partial(write_toy_data, train=30, dev=8, test=8),
    )


def test_the_probe_finds_the_layer_that_holds_the_label(paths):
    experiment = ClassifyExperiment(ClassifySettings(model=paths["model"], data=paths["texts"], batch_size=4))
    experiment._cache = PlantedCache()
    records = [record for trial in range(2) for record in probe_records(experiment, 6, [10], trial)]
    rows = probe_rows(records)
    assert [row["layer"] for row in rows] == [1, 2, 3, 4] and {row["n"] for row in rows} == {2}
    by_layer = {row["layer"]: row for row in rows}
    assert by_layer[PLANTED]["dev_mean"] == 100.0 and by_layer[PLANTED]["mean"] == 100.0
    assert all(row["dev_mean"] < 75.0 and row["mean"] < 75.0 for n, row in by_layer.items() if n != PLANTED)
    assert best_layers(rows, 1) == [PLANTED]


def test_probe_rows_select_the_kind_of_each_layer_on_dev():
    def record(kind, trial, dev, test, penalty=0.1, edge=False):
        scores = enumerate(zip(dev, test, strict=True), start=1)
        layers = [
            {"layer": n, "penalty": penalty, "penalty_on_edge": edge, "dev_f1": d, "test_f1": t}
            for n, (d, t) in scores
        ]
        cell = {"setup": "s", "shots": 8, "epochs": 5, "trial": trial}
        return {"key": f"{kind}{trial}", **cell, "features": kind, "layers": layers}

    records = [
        record("none", 0, [0.5, 0.2], [0.4, 0.1], penalty=1.0),
        record("none", 1, [0.7, 0.2], [0.6, 0.3], penalty=0.01, edge=True),
        record("rms", 0, [0.1, 0.9], [0.2, 0.8]),
        record("rms", 1, [0.1, 0.7], [0.2, 0.6]),
    ]
    first, second = probe_rows(records)
    assert (first["layer"], first["features"], first["penalties"], first["edge"]) == (
        1,
        "none",
        [1.0, 0.01],
        True,
    )
    assert first["mean"] == pytest.approx(50.0) and first["dev_mean"] == pytest.approx(60.0)
    assert first["ci"] == pytest.approx(12.7062 * 10.0, rel=1e-4)  # t(0.975, 1 dof) x sd (10 √2) / √2
    assert (second["features"], second["edge"], second["mean"], second["dev_mean"]) == (
        "rms",
        False,
        pytest.approx(70.0),
        pytest.approx(80.0),
    )
    assert best_layers([first, second], 1) == [2] and best_layers([first, second], 2) == [1, 2]
    tie = [record("rms", 0, [0.5, 0.0], [0.9, 0.0]), record("none", 0, [0.5, 0.0], [0.1, 0.0])]
    assert probe_rows(tie)[0]["features"] == "none"  # a tie on dev: the state as it is


def test_learned_weights_are_the_mean_at_each_cell_selected_lr():
    def run(method, lr, trial, dev, **weights):
        cell = {"setup": "s", "regime": "fe", "shots": 8, "epochs": 5, "method": method}
        return {"key": f"{method}{lr}{trial}", **cell, "lr": lr, "trial": trial, "dev_f1": dev, **weights}

    records = [
        run("scalar_mix", 1e-3, 0, 0.9, mix_weights=[0.2, 0.8], fused_layers=[1, 2]),
        run("scalar_mix", 1e-3, 1, 0.9, mix_weights=[0.4, 0.6], fused_layers=[1, 2]),
        run("scalar_mix", 1e-2, 0, 0.1, mix_weights=[0.9, 0.1], fused_layers=[1, 2]),  # not selected
        run("dwatt", 1e-3, 0, 0.5, depth_attention=[0.5, 0.25, 0.25], fused_layers=[0, 1, 2]),
        run("none", 1e-3, 0, 0.5),
    ]
    weights = learned_weights(records)
    assert set(weights) == {("s", "fe", 8, 5, "scalar_mix"), ("s", "fe", 8, 5, "dwatt")}
    mix = weights[("s", "fe", 8, 5, "scalar_mix")]
    assert mix["weights"] == pytest.approx([0.3, 0.7]) and mix["layers"] == [1, 2] and mix["n"] == 2
    assert weights[("s", "fe", 8, 5, "dwatt")]["layers"] == [0, 1, 2]


def test_the_best_layers_feed_every_method_config_and_a_recipe_model(paths):
    """The printed subset, executed as written, is a ``layers`` list every config takes; the model fuses
    exactly those layers, in a recipe too (``method_options``)."""
    rows = [{"layer": n, "dev_mean": dev} for n, dev in enumerate([40.0, 90.0, 70.0], start=1)]
    text = layers_text(best_layers(rows, 2))
    assert text == "layers=[2, 3]"
    for method in ENCODER_METHODS:  # the text as a user pastes it into a config
        config = eval(f"Config({text}, modules_to_save=['classifier'])", {"Config": method.config_cls})
        model = get_peft_model(tiny_bert(), config)
        assert fusion_layer_of(model).fused_layers["default"] == (2, 3), method.name
        assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, 5)
    options = eval(f"dict({text})")  # the YAML's method_options: {layers: [2, 3]}
    settings = ClassifySettings(model=paths["model"], data=paths["texts"], method_options=options)
    model, _ = ClassifyExperiment(settings).build(Cell("dwatt", "fe", 2, 1, 0))
    assert fusion_layer_of(model).fused_layers["default"] == (2, 3)


def classify_argv(paths, output, *extra):
    return [
        "classify",
        *("--model", paths["model"], "--data", paths["texts"]),
        *("--methods", "none", "scalar_mix", "dwatt"),
        *("--shots", "3", "--epochs", "3", "--trials", "2", "--lr", "1e-2", "1e-1"),
        *("--batch-size", "4", "--output", str(output), "--quiet", "--probe-layers", "2", *extra),
    ]


def probe_kinds(probes: list[dict]) -> int:
    """How many (trial, feature kind) the probes have, after checking both kinds are there and each has
    one record."""
    kinds = [(record["trial"], record["features"]) for record in probes]
    assert {kind for _, kind in kinds} == {"none", "rms"} and len(set(kinds)) == len(kinds)
    return len(kinds)


def test_classify_probe_layers_writes_the_figure_the_table_and_the_subset_and_resumes(
    paths, tmp_path, capsys, monkeypatch
):
    assert main(classify_argv(paths, tmp_path)) == 0
    out = capsys.readouterr().out
    probes = read_records(tmp_path / "results.probes.jsonl")
    assert probe_kinds(probes) == 2 * 2  # trials x feature kinds
    assert all([entry["layer"] for entry in record["layers"]] == [1, 2, 3] for record in probes)
    assert {record["key"].split("|")[0] for record in probes} == {"probe"}
    rows = probe_rows(probes)
    subset = best_layers(rows, 2)
    assert f"layers (best 2 on dev), N=3, max 3 epochs: {layers_text(subset)}" in out
    table = (tmp_path / "table.md").read_text()
    assert "## Layer probes" in table and f"best 2 layers on dev: `{layers_text(subset)}`" in table
    header = (
        "| layer | probe test accuracy | probe test macro-F1 | dwatt mean depth attention "
        "| scalar_mix mix weights |"
    )
    assert header in table
    lines = table.split(header)[1].splitlines()[2:5]
    assert [line.split(" | ")[0] for line in lines] == ["| 1", "| 2", "| 3"]
    mix = learned_weights(read_records(tmp_path / "results.jsonl"))
    weights = mix[next(key for key in mix if key[-1] == "scalar_mix")]["weights"]
    assert [line.rstrip(" |").split(" | ")[-1] for line in lines] == [f"{w:.3f}" for w in weights]
    assert (tmp_path / "layers.png").stat().st_size > 0 and "layers.png" in out
    against = table.split("## Against the best single layer chosen on dev")[1]
    assert "| best layer (dev) |" in against and "| dwatt |" in against and "(kept)" in against

    monkeypatch.setattr(core_probes, "probe_records", lambda *args: pytest.fail("trained again"))
    assert main(classify_argv(paths, tmp_path)) == 0  # resumed: nothing trains again
    assert read_records(tmp_path / "results.probes.jsonl") == probes
    assert f"layers (best 2 on dev), N=3, max 3 epochs: {layers_text(subset)}" in capsys.readouterr().out


def test_plot_redraws_the_layer_diagnostics_from_the_files(paths, tmp_path, capsys):
    assert main(classify_argv(paths, tmp_path / "run")) == 0
    capsys.readouterr()
    results = str(tmp_path / "run" / "results.jsonl")
    assert main(["plot", results, "--output", str(tmp_path / "plot"), "--probe-layers", "2"]) == 0
    assert "layers (best 2 on dev)" in capsys.readouterr().out
    assert (tmp_path / "plot" / "layers.png").stat().st_size > 0
    assert (tmp_path / "plot" / "table.md").read_text() == (tmp_path / "run" / "table.md").read_text()
    assert main(["plot", results, "--output", str(tmp_path / "plot")]) == 0
    assert "layers (best 3 on dev), N=3, max 3 epochs: layers=[1, 2, 3]" in capsys.readouterr().out


def test_plot_reads_no_probe_of_a_setup_the_runs_lack(paths, tmp_path):
    """Probes left by a sweep on other data (another setup) that would move every trial's best layer:
    the redrawn table is the one the sweep wrote."""
    assert main(classify_argv(paths, tmp_path)) == 0
    table = (tmp_path / "table.md").read_text()
    probes_file = tmp_path / "results.probes.jsonl"
    stale = []
    for record in read_records(probes_file):
        metric = record["metric"]
        layers = [{**e, f"dev_{metric}": 1.0, f"test_{metric}": 0.0} for e in record["layers"]]
        stale.append({**record, "setup": "feedfacecafe", "key": record["key"] + "x", "layers": layers})
    with probes_file.open("a") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in stale)
    assert main(["plot", str(tmp_path / "results.jsonl"), "--probe-layers", "2"]) == 0
    assert (tmp_path / "table.md").read_text() == table
    assert "feedfacecafe" not in table and "best layer (dev)" in table


def test_ner_probe_layers_reads_the_labelled_positions_and_reports_f1(paths, tmp_path, capsys):
    argv = [
        "ner",
        *("--model", paths["model"], "--data", paths["ner"], "--methods", "none", "scalar_mix"),
        *("--shots", "2", "--epochs", "2", "--trials", "2", "--lr", "1e-2", "--batch-size", "4"),
        *("--output", str(tmp_path), "--quiet", "--probe-layers"),
    ]
    assert main(argv) == 0
    probes = read_records(tmp_path / "results.probes.jsonl")
    assert len(probes) == 2 * 2 and all(
        r["metric"] == "f1" and len(r["layers"]) == 3 for r in probes
    )  # trials x kinds
    table = (tmp_path / "table.md").read_text()
    assert "| layer | probe test micro-F1 | scalar_mix mix weights |" in table
    assert "layers (best 3 on dev), N=2, max 2 epochs: layers=[1, 2, 3]" in capsys.readouterr().out


def test_plot_layers_without_probes_draws_nothing(tmp_path):
    assert plot_layers([], [], tmp_path / "layers.png") is None and not (tmp_path / "layers.png").exists()
    assert layers_markdown([], []) == ""


def _synthetic(methods=("none", "scalar_mix", "dwatt")) -> tuple[list[dict], list[dict]]:
    """Probe records (3 layers, 2 kinds, 3 trials, two shot sizes; trial 0's penalty at its grid's end)
    and runs of ``methods`` at LRs 0.01 and 0.1 with weights."""
    probes, runs = [], []
    for shots in (2, 8):
        for kind, lr in (("none", 1e-2), ("rms", 1e-1)):
            for trial, noise in enumerate((0.0, 0.05, 0.3)):
                layers = [
                    {
                        "layer": n,
                        "penalty": 10.0**-trial,
                        "penalty_on_edge": trial == 0,
                        "dev_f1": 0.2 * n + noise,
                        "test_f1": 0.25 * n + noise - 0.2,
                    }
                    for n in (1, 2, 3)
                ]
                place = {"shots": shots, "epochs": 5, "trial": trial, "setup": "s"}
                probes.append(
                    {"key": f"probe|{shots}|{trial}|{kind}", **place, "features": kind, "layers": layers}
                )
                cell = {**place, "lr": lr}
                for method in methods:
                    weights = {"fused_layers": [1, 2, 3]}
                    if method == "scalar_mix":
                        weights["mix_weights"] = [0.2, 0.3, 0.5]
                    if method == "dwatt":
                        weights["depth_attention"] = [0.6, 0.1, 0.3]
                    run = {"key": f"{method}|{shots}|{trial}|{lr}", **cell, "method": method, "regime": "fe"}
                    runs.append({**run, "dev_f1": 0.5 + noise, "test_f1": 0.4 + noise, **weights})
    return probes, runs


@pytest.fixture
def layer_figure(monkeypatch, tmp_path):
    """The figure :func:`plot_layers` draws (captured as it is saved), text and legends placed."""
    saved = []
    original = layers_module._save

    def keep(figure, path):
        saved.append(figure)
        return original(figure, path)

    monkeypatch.setattr(layers_module, "_save", keep)
    assert plot_layers(*_synthetic(), tmp_path / "layers.png", top=2) == tmp_path / "layers.png"
    (figure,) = saved
    figure.canvas.draw()
    return figure


def test_the_layer_figure_draws_each_method_in_its_colour_and_the_probe_in_black(layer_figure):
    colours: dict[str, set[str]] = {}
    for ax in layer_figure.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    assert colours == {
        "linear probe (test)": {to_hex("black")},
        "linear probe (dev)": {to_hex("grey")},
        "best 2 on dev": {to_hex("black")},
        "last layer (plain head) (test)": {to_hex(method_color("none"))},
        "ScalarMix (test)": {to_hex(method_color("scalar_mix"))},
        "DWAtt (test)": {to_hex(method_color("dwatt"))},
        "ScalarMix mix weights": {to_hex(method_color("scalar_mix"))},
        "DWAtt mean depth attention": {to_hex(method_color("dwatt"))},
        "uniform 1/K": {to_hex("grey")},
    }


def test_the_layer_figure_legends_sit_beside_the_panels_and_axes_say_what_they_show(layer_figure):
    axes = layer_figure.axes
    assert len(axes) == 4  # two shot sizes: probes above, weights below
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None]
    assert len(legends) == 2  # one per row, right of its last panel
    for legend in legends:
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in axes)
    assert axes[0].get_ylabel() == "test micro-F1 (%), mean ± 95% CI"
    assert axes[2].get_ylabel() == "learned layer weight (mean over trials)"
    assert axes[2].get_xlabel() == axes[3].get_xlabel() == "layer n (z_n: output of block n)"
    assert [ax.get_title() for ax in axes[:2]] == ["N=2, max 5 epochs", "N=8, max 5 epochs"]


def test_the_layer_figure_clips_the_probe_band_to_0_100(layer_figure):
    bands = [c for ax in layer_figure.axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    lows = [path.vertices[:, 1].min() for band in bands for path in band.get_paths()]
    assert min(lows) == 0.0  # layer 1's t-CI of (5, 10, 35) F1 reaches below 0: clipped there


def test_the_layer_table_of_synthetic_runs():
    probes, runs = _synthetic()
    text = layers_markdown(probes, runs, top=2)
    assert text.count("best 2 layers on dev: `layers=[2, 3]`") == 2
    header = "| layer | probe test micro-F1 | dwatt mean depth attention | scalar_mix mix weights |"
    rows = text.split(header)[1].splitlines()[2:5]
    assert rows[0].startswith("| 1 | 16.7 ± 39.9 λ 0.01-1 ⚠ (dev 31.7) (n=3)") and rows[0].endswith(
        " | 0.600 | 0.200 |"
    )
    assert rows[2].endswith("| 0.300 | 0.500 |") and "λ 0.01-1 ⚠ (dev 71.7) (n=3)" in rows[2]
    assert "⚠ a probe's penalty is at the end of its grown grid" in text


def test_probe_layers_reads_the_flag_then_the_yaml(paths, tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text("probe_layers: 4\n")
    base = ["classify", "--model", paths["model"], "--data", paths["texts"]]
    assert resolve(build_parser().parse_args(base))[1]["probe_layers"] is None  # off by default
    assert resolve(build_parser().parse_args([*base, "--config", str(config)]))[1]["probe_layers"] == 4
    assert resolve(build_parser().parse_args([*base, "--probe-layers"]))[1]["probe_layers"] == 3
    flag = [*base, "--config", str(config), "--probe-layers", "2"]
    assert resolve(build_parser().parse_args(flag))[1]["probe_layers"] == 2


def test_a_sweep_trains_the_probes_after_the_prefill_and_a_dry_run_trains_none(
    paths, tmp_path, capsys, monkeypatch
):
    """One process: the cache is filled with what the runs and the probes read (the head's positions
    only: every method here is token-wise), its encoder released, then the probes train, then the
    runs; ``--dry-run`` counts the probes' samples in the printed bytes and trains nothing."""
    assert main([*classify_argv(paths, tmp_path / "dry"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "layer probes planned: 2 trials (not run by a dry run)" in out
    assert "first positions x 3 blocks" in out and not (tmp_path / "dry").exists()

    seen = []
    original = sweep.run_probes

    def spied(experiment, grid, progress=True):
        cache = experiment._cache
        seen.append((cache.base_model, cache.positions.name, read_records(grid["results"])))
        return original(experiment, grid, progress)

    monkeypatch.setattr(sweep, "run_probes", spied)
    assert main(classify_argv(paths, tmp_path / "run")) == 0
    assert seen == [(None, "first", [])]  # encoder released, head positions only, before any run
    assert probe_kinds(read_records(tmp_path / "run" / "results.probes.jsonl")) == 2 * 2  # trials x kinds
    assert len(read_records(tmp_path / "run" / "results.jsonl")) == 3 * 2 * 2


def test_probes_alone_fill_the_cache_they_read_before_it_is_released(paths, tmp_path, capsys):
    """A grid without FE cells (fine-tuning only) still plans and prefills the probes' cache."""
    argv = [*classify_argv(paths, tmp_path), "--regimes", "ft", "--methods", "none", "--epochs", "1"]
    assert main([*argv, "--dry-run"]) == 0
    assert "first positions x 3 blocks" in capsys.readouterr().out  # the probes' samples, dev and test
    assert main(argv) == 0
    assert probe_kinds(read_records(tmp_path / "results.probes.jsonl")) == 2 * 2  # trials x kinds


def test_a_deep_model_gets_at_most_twelve_layer_labels_and_always_its_last():
    labels = layer_tick_labels(range(1, 19))  # Gemma 3 270M: 18 blocks ran into each other
    assert [label for label in labels if label] == ["2", "4", "6", "8", "10", "12", "14", "16", "18"]
    assert layer_tick_labels(range(1, 7)) == ["1", "2", "3", "4", "5", "6"]  # MiniLM: every one
    assert sum(1 for label in layer_tick_labels(range(1, 33)) if label) <= 12  # Llama-3.1-8B's 32


def test_the_layer_table_claims_no_interval_for_one_trial_in_any_column():
    """Every column of a probe row drops the "±" for n = 1, the further metrics' (macro-F1) as the first."""
    probes = []
    for kind in ("none", "rms"):
        layers = [
            {
                "layer": n,
                "penalty": 0.01,
                "penalty_on_edge": True,
                "dev_accuracy": 0.2 * n,
                "test_accuracy": 0.2 * n,
                "test_macro_f1": 0.1 * n,
            }
            for n in (1, 2)
        ]
        cell = {"shots": 2, "epochs": 5, "trial": 0, "features": kind, "setup": "s", "metric": "accuracy"}
        probes.append({"key": f"probe|{kind}", **cell, "metrics": ["accuracy", "macro_f1"], "layers": layers})
    text = layers_markdown(probes, [], top=1)
    assert "| layer | probe test accuracy | probe test macro-F1 |" in text
    assert "| 1 | 20.0 λ 0.01 ⚠ (dev 20.0) (n=1) | 10.0 |" in text and "±" not in text.split("| layer |")[1]


def test_probe_layers_beyond_the_model_s_depth_are_clamped_and_said():
    """--probe-layers 99 on 3 layers: "best 3", a note saying why, never "best 99"."""
    probes, runs = _synthetic()
    lines = best_layers_lines(probes, 99)
    assert lines == [
        "layers (best 3 on dev), N=2, max 5 epochs: layers=[1, 2, 3]",
        "layers (best 3 on dev), N=8, max 5 epochs: layers=[1, 2, 3]",
        "note: --probe-layers 99: the model has 3 layers, so all 3 are listed",
    ]
    text = layers_markdown(probes, runs, top=99)
    assert "99" not in text.replace("--probe-layers 99", "")
    assert text.count("best 3 layers on dev") == 3 and "(--probe-layers 99: the model has 3 layers" in text
    assert best_layers_lines(probes, 2)[-1].startswith("layers (best 2 on dev)")  # within the depth: no note


def _runs_after_trial_0_probes_pick(block: int, tmp_path, argv: list[str], runs: list[dict]) -> list[dict]:
    """Rewrite trial 0's probes so that ``block`` scores 1.0 on dev and every other 0.0, run the sweep
    ``argv`` again, and return the records it added to those of ``runs``."""
    lines = []
    for record in read_records(tmp_path / "results.probes.jsonl"):
        if record["trial"] == 0:
            for entry in record["layers"]:
                entry[f"dev_{record['metric']}"] = float(entry["layer"] == block)
        lines.append(json.dumps(record))
    (tmp_path / "results.probes.jsonl").write_text("\n".join(lines) + "\n")
    assert main(argv) == 0
    old = {run["key"] for run in runs}
    return [r for r in read_records(tmp_path / "results.jsonl") if r["key"] not in old]


def test_probe_fuse_fuses_each_trial_s_best_dev_probes(paths, tmp_path):
    """``--probe-fuse 2``: each trial's depth mixes fuse the 2 blocks whose probes scored best on dev in
    that trial (implies the probes), named in the key; the plain head is untouched; other probes that
    change a trial's best blocks make that trial's mixes run again, from the new blocks."""
    argv = [*classify_argv(paths, tmp_path)[:-2], "--methods", "none", "scalar_mix", "--probe-fuse", "2"]
    assert main(argv) == 0
    probes = read_records(tmp_path / "results.probes.jsonl")
    ranks = core_probes.probe_ranks(probes)
    assert sorted(ranks) == [(3, 3, 0), (3, 3, 1)] and all(sorted(r) == [1, 2, 3] for r in ranks.values())
    assert {t: r[0] for t, r in ranks.items()} == core_probes.probe_starts(probes)
    runs = read_records(tmp_path / "results.jsonl")
    mixes = [r for r in runs if r["method"] == "scalar_mix"]
    assert len(mixes) == 4
    for record in mixes:
        chosen = sorted(ranks[(3, 3, record["trial"])][:2])
        assert record["probe_layers"] == chosen and record["fused_layers"] == chosen  # what the model fused
        assert len(record["mix_weights"]) == 2
        assert record["key"].endswith("|layers=" + ",".join(map(str, chosen)))
    assert not any("probe_layers" in r or "|layers=" in r["key"] for r in runs if r["method"] == "none")
    table = (tmp_path / "table.md").read_text()
    assert "| scalar_mix (the 2 best probed blocks) |" in table  # said so, in the tables that name a method
    assert "Options given to these runs: ScalarMix: the 2 best probed blocks." in table
    assert all(r["settings"]["probe_fuse"] == core_probes.PROBE_SETTINGS for r in runs)  # what moves them
    assert all(r["settings"]["probe_fuse_count"] == 2 for r in runs)

    # trial 0's probes now rank the block it left out first: its mixes run again, nothing else does
    left_out = next(block for block in (1, 2, 3) if block not in ranks[(3, 3, 0)][:2])
    new = _runs_after_trial_0_probes_pick(left_out, tmp_path, argv, runs)
    assert [(r["method"], r["trial"]) for r in new] == [("scalar_mix", 0)] * 2
    assert all(left_out in r["probe_layers"] for r in new)
    shown = [r for r in read_task_records(tmp_path / "results.jsonl") if r["method"] == "scalar_mix"]
    expected = [*new, *(r for r in mixes if r["trial"] == 1)]  # trial 0's old blocks are no longer read
    assert sorted(r["key"] for r in shown) == sorted(r["key"] for r in expected)


def test_probe_start_starts_each_trial_on_its_best_dev_probe(paths, tmp_path):
    """``--probe-start``: each trial's LayerMix starts one-hot on the block whose probe scored best on
    dev in that trial (implies the probes); the plain head is untouched; the setup says so."""
    no_probes = classify_argv(paths, tmp_path)[:-2]  # without --probe-layers: --probe-start trains them
    argv = [*no_probes, "--methods", "none", "layer_mix", "--probe-start"]
    assert main(argv) == 0
    probes = read_records(tmp_path / "results.probes.jsonl")
    starts = core_probes.probe_starts(probes)
    assert sorted(starts) == [(3, 3, 0), (3, 3, 1)] and set(starts.values()) <= {1, 2, 3}
    runs = read_records(tmp_path / "results.jsonl")
    mixes = [r for r in runs if r["method"] == "layer_mix"]
    assert len(mixes) == 4 and all(r["start_layer"] == starts[(3, 3, r["trial"])] for r in mixes)
    assert not any("start_layer" in r for r in runs if r["method"] == "none")
    assert all(r["settings"]["probe_start"] == core_probes.PROBE_SETTINGS for r in runs)
    for record in mixes:  # the weights began one-hot there and stay on the simplex (a bounded blend)
        weights = record["mix_weights"]
        assert max(range(3), key=weights.__getitem__) + 1 == record["start_layer"]
        assert min(weights) >= 0.0 and abs(sum(weights) - 1.0) < 1e-5
        assert record["key"].endswith(f"|start={record['start_layer']}")  # the start is in the key
    assert any(r["mix_weights"][r["start_layer"] - 1] != 1.0 for r in mixes)  # and some moved from it
    assert not any("|start=" in r["key"] for r in runs if r["method"] == "none")

    # other probes that move trial 0's best block: its mix runs again from there, nothing else does
    moved = next(block for block in (1, 2, 3) if block != starts[(3, 3, 0)])
    new = _runs_after_trial_0_probes_pick(moved, tmp_path, argv, runs)
    again = read_records(tmp_path / "results.jsonl")
    assert sorted((r["method"], r["trial"], r["start_layer"]) for r in new) == [("layer_mix", 0, moved)] * 2
    assert len(again) == len(runs) + 2  # the old start's records stay in the file, no longer read
    shown = [r for r in read_task_records(tmp_path / "results.jsonl") if r["method"] == "layer_mix"]
    assert sorted((r["trial"], r["start_layer"]) for r in shown) == sorted(
        (t, moved if t == 0 else starts[(3, 3, t)]) for t in (0, 1) for _ in range(2)
    )  # a reader of the file sees the newest start of each run, never the old one
    log = read_sweep_log(tmp_path / "results.jsonl")
    assert [line["runs"] for line in log] == [len(runs), 2]  # each invocation's new runs, starts counted


def test_the_layer_tables_of_two_setups_are_each_titled_with_their_setup():
    """A file probed again under a new setup: one table per setup, named as every report names it."""

    def probe(setup, trial, dev):
        layers = [
            {"layer": n, "penalty": 0.01, "penalty_on_edge": False, "dev_f1": d, "test_f1": d}
            for n, d in enumerate(dev, start=1)
        ]
        cell = {"setup": setup, "shots": 8, "epochs": 5, "trial": trial, "features": "none"}
        return {"key": f"{setup}{trial}", **cell, "layers": layers}

    scores = (("s", [0.2, 0.9]), ("t", [0.8, 0.1]))
    text = layers_markdown([probe(setup, trial, dev) for setup, dev in scores for trial in (0, 1)], [])
    first, second = text.split("**N=8, max 5 epochs (setup ")[1:]
    assert first.startswith("s)**") and "| 2 | 90.0 ± 0.0 λ 0.01 (dev 90.0) (n=2) |" in first
    assert second.startswith("t)**") and "| 1 | 80.0 ± 0.0 λ 0.01 (dev 80.0) (n=2) |" in second


def test_the_layer_figure_names_each_setup_on_its_panels_second_line(monkeypatch, tmp_path):
    """Probes and runs of two setups: a column each, the setup on the title's second line (titles as
    long as five columns' side by side overlap on one line)."""
    probes, runs = _synthetic()
    again = [
        {**r, "setup": "941bf106e0c7", "key": r["key"] + "|again"}
        for r in (*probes, *runs)
        if r["shots"] == 8
    ]
    saved = []
    monkeypatch.setattr(layers_module, "_save", lambda figure, path: saved.append(figure) or path)
    plot_layers(
        probes + [r for r in again if "method" not in r],
        runs + [r for r in again if "method" in r],
        tmp_path / "l.png",
    )
    (figure,) = saved
    titles = sorted(ax.get_title() for ax in figure.axes if ax.get_title())
    assert titles == [
        "N=2, max 5 epochs\n(setup s)",
        "N=8, max 5 epochs\n(setup 941bf106e0c7)",
        "N=8, max 5 epochs\n(setup s)",
    ]
