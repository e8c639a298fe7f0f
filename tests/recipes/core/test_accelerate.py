"""`accelerate launch` with 2 CPU processes: the sweep's runs are shared out, each run as in one process."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import write_text_data, write_tiny_model, write_toy_data

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.engine.processes import check_workers, launched_processes, share
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log, sweep_log_path

needs_launch = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch without torch.distributed: accelerate cannot launch"
)
# what a run's numbers are, and the first words of the table's legend, per task
SAME = {
    "ner": ("dev_f1", "test_f1", "best_epoch", "curve", "lr"),
    "classify": ("dev_accuracy", "test_accuracy", "test_macro_f1", "best_epoch", "curve", "lr"),
}
LEGEND = {"ner": "Test micro-F1 (seqeval)", "classify": "Test accuracy at each"}


@pytest.fixture(scope="module", params=["ner", "classify"])
def sweep(request, tmp_path_factory):
    """A tiny sweep of a task: 2 methods x 2 shots x 2 trials on FE, 2 LRs on trial 0, the selected one
    on trial 1."""
    root = tmp_path_factory.mktemp("accelerate")
    model = write_tiny_model(root / "model")
    if request.param == "ner":
        data = write_toy_data(root / "data", train=30, dev=8, test=8)
    else:
        data = write_text_data(root / "data")
    run = lambda output: [  # noqa: E731
        request.param,
        *("--model", model, "--data", data, "--methods", "none", "dwatt", "--regimes", "fe"),
        *("--shots", "2", "3", "--epochs", "2", "--trials", "2", "--select-trials", "1"),
        *("--lr", "0.03", "0.1", "--output", str(output), "--quiet"),
    ]
    run.task = request.param
    return run


def _launch(argv: list[str], cpu: bool) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes 2 -m layerfusion_recipes.cli ARGV`` on CPU."""
    with socket.socket() as probe:  # a free port for the process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)
    if cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(port), "-m", "layerfusion_recipes.cli", *argv]
    return subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)


@needs_launch
def test_two_processes_share_the_sweep_and_match_one_process(sweep, tmp_path, capsys):
    assert main(sweep(tmp_path / "one")) == 0
    alone = {r["key"]: r for r in read_records(tmp_path / "one" / "results.jsonl")}
    capsys.readouterr()

    launched = _launch(sweep(tmp_path / "two"), cpu=True)
    assert launched.returncode == 0, launched.stderr[-3000:]
    lines = (tmp_path / "two" / "results.jsonl").read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 12  # once each: 4 cells x 2 LRs, then 4 at the selected LR
    shared = {r["key"]: r for r in read_records(tmp_path / "two" / "results.jsonl")}
    assert shared.keys() == alone.keys()  # the key does not depend on the processes
    for key, record in shared.items():
        assert {k: record[k] for k in SAME[sweep.task]} == {k: alone[key][k] for k in SAME[sweep.task]}, key
    assert {r["num_processes"] for r in shared.values()} == {2}
    assert {r["num_processes"] for r in alone.values()} == {1}
    assert collections.Counter(r["process_index"] for r in shared.values()) == {0: 6, 1: 6}
    assert any(r[SAME[sweep.task][0]] > 0 for r in shared.values())  # the comparison is not between zeros
    assert launched.stdout.count(LEGEND[sweep.task]) == 1  # the table: by the main process only
    assert (tmp_path / "two" / "table.md").read_text() == (tmp_path / "one" / "table.md").read_text()
    (launch,) = read_sweep_log(tmp_path / "two" / "results.jsonl")  # one line: by the main process only
    assert launch["num_processes"] == 2 and launch["completed"]
    assert launch["runs"] == launch["runs_total"] == launch["runs_planned"] == 12  # both processes' runs
    assert [line["num_processes"] for line in read_sweep_log(tmp_path / "one" / "results.jsonl")] == [1]


@needs_launch
def test_launch_accelerate_cannot_set_up_is_refused(sweep, tmp_path):
    launched = _launch(sweep(tmp_path), cpu=False)  # no ACCELERATE_USE_CPU: each process would be alone
    assert launched.returncode != 0
    refusal = f"layerfusion {sweep.task}: error: the launcher started 2 processes but accelerate set up 1"
    assert launched.stderr.count(refusal) == 2 and "ACCELERATE_USE_CPU=1" in launched.stderr  # each process
    assert "UserError" not in launched.stderr  # one line each, no traceback of ours (torchrun adds its own)
    assert not (tmp_path / "results.jsonl").exists()
    assert not sweep_log_path(tmp_path / "results.jsonl").exists()  # refused before the sweep started


def test_share_gives_every_item_to_exactly_one_process():
    items = list(range(7))
    parts = [share(items, index, 3) for index in range(3)]
    assert parts == [[0, 3, 6], [1, 4], [2, 5]]
    assert share(items, 0, 1) == items
    with pytest.raises(ValueError, match="process_index=3, num_processes=3"):
        share(items, 3, 3)


def test_launched_processes_reads_the_launchers_variables():
    assert launched_processes({"WORLD_SIZE": "4"}) == 4
    assert launched_processes({"OMPI_COMM_WORLD_SIZE": "2"}) == 2
    assert launched_processes({"WORLD_SIZE": ""}) == 1
    assert launched_processes({}) == 1


def test_worker_pools_are_refused_inside_a_multi_process_launch():
    check_workers(4, 1)  # a pool in a one-process run
    check_workers(1, 4)  # a launch without pools
    with pytest.raises(ValueError, match="--workers 2 under accelerate launch with 2 processes"):
        check_workers(2, 2)


@needs_launch
def test_two_processes_start_each_fusion_on_the_probes_of_the_main_process(tmp_path, capsys):
    """--probe-start under 2 processes: the main process trains the layer probes, the other reads them
    from the probes file (it used to find none and stop), and every run equals one process's."""
    model, data = write_tiny_model(tmp_path / "model"), write_text_data(tmp_path / "data")
    argv = lambda output: [  # noqa: E731
        "classify",
        *("--model", model, "--data", data, "--methods", "none", "layer_mix", "--regimes", "fe"),
        *("--shots", "2", "--epochs", "2", "--trials", "2", "--lr", "0.03", "--probe-start"),
        *("--output", str(output), "--quiet"),
    ]
    assert main(argv(tmp_path / "one")) == 0
    alone = {r["key"]: r for r in read_records(tmp_path / "one" / "results.jsonl")}
    capsys.readouterr()
    launched = _launch(argv(tmp_path / "two"), cpu=True)
    assert launched.returncode == 0, launched.stderr[-3000:]
    shared = {r["key"]: r for r in read_records(tmp_path / "two" / "results.jsonl")}
    assert shared.keys() == alone.keys() and len(shared) == 4  # 2 methods x 2 trials
    assert {r["process_index"] for r in shared.values()} == {0, 1}  # both processes ran layer_mix or none
    for key, record in shared.items():
        assert {k: record[k] for k in SAME["classify"]} == {k: alone[key][k] for k in SAME["classify"]}, key
