"""``core.engine.experiment``: what every task's experiment shares (here: each run's model is freed before
the next one is built)."""

from __future__ import annotations

import weakref

import pytest
from conftest import collector_off, toy_dataset, write_tiny_model

from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings
from peft_layerfusion.registration import ENCODER_METHODS

METHODS = ["none", *(method.name for method in ENCODER_METHODS)]


@pytest.fixture(autouse=True)
def without_the_cyclic_collector():
    """The cyclic collector off, as between its rare full passes in a long sweep."""
    with collector_off():
        yield


class Watched(NerExperiment):
    """An experiment that keeps a weak reference to the first block of every model it builds."""

    built: list[weakref.ref]

    def build(self, cell):
        model, located = super().build(cell)
        self.built.append(weakref.ref(located.blocks[0]))  # the base model's, inside the run's model
        return model, located


@pytest.mark.parametrize("method", METHODS)
def test_a_finished_runs_model_is_freed_before_the_next_is_built(tmp_path, method):
    """A sweep must never hold a finished run's model (R+1 on Gemma 3: 1-2 GB per run), as it did while
    the fusion's hooks put the model in reference cycles and nothing collected them before each build."""
    settings = NerSettings(model=write_tiny_model(tmp_path / "tiny"), data="toy", max_length=64)
    experiment = Watched(settings, toy_dataset(train=20, dev=4, test=4))
    experiment.built = []
    cell = Cell(method, "fe", shots=2, epochs=1, trial=0)
    experiment.run(cell, lr=1e-3)
    experiment.run(cell, lr=1e-2)
    assert experiment.built[0]() is None
