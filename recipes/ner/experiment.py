"""NER over the shared few-shot core: one experiment (model + data) and the runs of its cells.

The :class:`Experiment` loads the tokenizer, encodes the dev and test splits once and, for the FE
regime, owns the feature cache shared by every cell (keeping the labelled positions only where every
method of the sweep reads no other: :data:`LABELLED_POSITIONS`, :func:`cache_positions_for`;
:class:`~layerfusion_recipes.core.experiment.FewShotExperiment` does the rest). What is NER's own:
the token classifier, the N-shot sample (``N * C`` sentences uniformly, C = entity types;
:func:`sample_size`), the loss at the labelled positions
(:class:`~layerfusion_recipes.ner.training.TokenClassifierRunner`), seqeval's micro-F1
(:class:`~layerfusion_recipes.ner.scoring.SpanScorer`) and the gold entities the model cannot reach.

Seeds (:mod:`layerfusion_recipes.core.cells`): trial ``t`` draws its N-shot sample from seed
``(shots, t)`` (so every method sees the same sample in a trial: paired comparison) and initialises
the head and fusion module from seed ``seed + t``. A record's ``key`` names the cell, its own LR and
the settings that change a result (:data:`SETUP_FIELDS`), never the grid it ran in.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..core import experiment as core_experiment
from ..core.batches import IGNORE_INDEX
from ..core.cells import Cell, lrs_train_together, reads_head_positions_only, record_key, sample_seed
from ..core.experiment import SHARED_SETUP_FIELDS, FewShotExperiment, TaskSettings
from ..core.feature_cache import KeptPositions
from ..core.fitting import RunResult
from ..core.probes import states_at
from ..core.runner import Runner, labelled_positions
from ..data.gold import GoldReach, gold_reach
from ..data.readers import NerDataset, encode_ner
from ..data.sampling import sample_shots
from ..data.sources import NerColumns, load_ner
from .candidates import StackedRunner
from .models import load_token_classifier, token_classifier_skeleton
from .scoring import SentenceSpanCounts, SpanScorer
from .training import RunResult as NerRunResult
from .training import TokenClassifierRunner

__all__ = [
    "LABELLED_POSITIONS",
    "Cell",
    "Experiment",
    "ExperimentSettings",
    "cache_positions_for",
    "check_sample_sizes",
    "lrs_train_together",
    "reads_labelled_only",
    "record_key",
    "sample_seed",
    "sample_size",
]


def _labelled_positions(feature: dict) -> list[int]:
    return [position for position, label in enumerate(feature["labels"]) if label != IGNORE_INDEX]


# what the loss and the scorer read: the labelled positions (the first sub-word of each word)
LABELLED_POSITIONS = KeptPositions("labelled", _labelled_positions)

# ExperimentSettings fields that change a result, hence part of every record key
SETUP_FIELDS = (
    "model",
    "data",
    "language",
    *SHARED_SETUP_FIELDS,
    "train_sentences",
    "fixed_sample",
)


@dataclass
class ExperimentSettings(TaskSettings):
    """Everything about a NER experiment except the grid (the shared fields:
    :class:`~layerfusion_recipes.core.experiment.TaskSettings`; ``model`` is an encoder's or a
    decoder's name or path, :func:`~layerfusion_recipes.ner.models.load_token_classifier`, ``data``
    see ``data.sources.load_ner``).

    Args:
        language: WikiANN language.
        tokens_column: Token column of tabular data (``None``: by convention).
        tags_column: Tag column of tabular data (``None``: by convention).
        label_names: Names of integer tags (``None``: the ``ClassLabel`` names).
        tag_scheme: Tag scheme of the data (``auto`` detects; converted to IOB2).
        train_sentences: Sample exactly this many training sentences per trial instead of
            ``N * C`` (e.g. a fixed 100-sentence budget); ``None``: the N-shot protocol.

    ``cache_positions`` is ``all`` or ``labelled`` (:data:`LABELLED_POSITIONS`).
    """

    SETUP_FIELDS: ClassVar[tuple[str, ...]] = SETUP_FIELDS
    READ_POSITIONS: ClassVar[str] = LABELLED_POSITIONS.name
    TASK: ClassVar[str] = "ner"

    language: str | None = None
    tokens_column: str | None = None
    tags_column: str | None = None
    label_names: tuple[str, ...] | None = None
    tag_scheme: str = "auto"
    train_sentences: int | None = None

    def make_experiment(self) -> Experiment:
        """The :class:`Experiment` of these settings (what a sweep's workers build)."""
        return Experiment(self)


def reads_labelled_only(method: str) -> bool:
    """Whether a run of ``method`` reads the encoder's states at the labelled positions only: the
    plain head and the token-wise fusion methods; R+n attends over every position
    (:func:`~layerfusion_recipes.core.cells.reads_head_positions_only`).

    Example:
        >>> reads_labelled_only("dwatt"), reads_labelled_only("extra_layers")
        (True, False)
    """
    return reads_head_positions_only(method)


def cache_positions_for(methods: Iterable[str]) -> str:
    """The ``cache_positions`` of a NER feature cache shared by ``methods``: ``labelled`` when every
    one of them reads no other position, else ``all``.

    Example:
        >>> cache_positions_for(["none", "concat"]), cache_positions_for(["none", "extra_layers"])
        ('labelled', 'all')
    """
    return core_experiment.cache_positions_for(methods, LABELLED_POSITIONS.name)


def sample_size(settings: ExperimentSettings, shots: int, num_types: int) -> int:
    """Training sentences a trial of ``shots`` asks for: ``train_sentences`` if set, else ``N * C``."""
    return settings.train_sentences or shots * num_types


def check_sample_sizes(
    settings: ExperimentSettings, shots: Iterable[int], train_size: int, num_types: int
) -> None:
    """Refuse shot sizes the train split cannot give (instead of silently training on less).

    Raises:
        ValueError: naming the option, the value, what it asks for and the largest allowed.

    Example:
        >>> settings = ExperimentSettings(model="m", data="d")
        >>> check_sample_sizes(settings, [8, 64], train_size=100, num_types=4)  # 64 * 4 > 100
        Traceback (most recent call last):
        ValueError: --shots 64 asks for 64 x 4 entity types = 256 training sentences, ...
    """
    if num_types == 0 and not settings.train_sentences:
        raise ValueError(
            "the train split has no entity (every tag is O): N x C sentences with C = 0 entity types; "
            "give --train-sentences K to sample K sentences instead"
        )
    for n in sorted(set(shots)):
        wanted = sample_size(settings, n, num_types)
        if wanted <= train_size:
            continue
        if settings.train_sentences:
            raise ValueError(
                f"--train-sentences {wanted} asks for more training sentences than the train split "
                f"has ({train_size}); use --train-sentences <= {train_size}"
            )
        raise ValueError(
            f"--shots {n} asks for {n} x {num_types} entity types = {wanted} training sentences, the "
            f"train split has {train_size}; use --shots <= {train_size // num_types}"
        )


class Experiment(FewShotExperiment):
    """NER as a :class:`~layerfusion_recipes.core.experiment.FewShotExperiment` of
    :class:`ExperimentSettings` (and, optionally, a :class:`NerDataset` already loaded).

    Example:
        >>> from layerfusion_recipes.core.cells import Cell
        >>> experiment = Experiment(ExperimentSettings(model=model_path, data=ner_data, lr=[1e-2]))
        >>> record = experiment.run(Cell("dwatt", "fe", shots=2, epochs=2, trial=0))
        >>> record["key"], 0.0 <= record["test_f1"] <= 100.0
        ('dwatt|fe|2|2|0|lr=0.01|...', True)
    """

    def __init__(self, settings: ExperimentSettings, dataset: NerDataset | None = None) -> None:
        columns = NerColumns(
            settings.tokens_column, settings.tags_column, settings.label_names, settings.tag_scheme
        )
        data = dataset if dataset is not None else load_ner(settings.data, settings.language, 0, columns)
        self._prepare(settings, data, data.labels)
        self.id2label = dict(enumerate(self.labels))
        special = self.tokenizer.num_special_tokens_to_add()
        if settings.max_length <= special:
            raise ValueError(
                f"--max-length {settings.max_length} leaves no room for a word: the tokenizer adds "
                f"{special} special tokens; use --max-length > {special}"
            )
        skeleton = token_classifier_skeleton(settings.model, len(self.labels))
        self._check_model(skeleton, settings.head_modules)
        dev = self.data.dev[: settings.dev_limit] if settings.dev_limit else self.data.dev
        # sorted by length: less padding in evaluation batches (micro-F1 does not depend on order)
        self.dev = sorted(
            encode_ner(self.tokenizer, dev, self.label2id, settings.max_length),
            key=lambda f: len(f["input_ids"]),
        )
        self.dev_reach = self._check_reach(gold_reach(self.dev, self.id2label), "dev")
        test = self.data.test[: settings.test_limit] if settings.test_limit else self.data.test
        self.test = sorted(
            encode_ner(self.tokenizer, test, self.label2id, settings.max_length),
            key=lambda f: len(f["input_ids"]),
        )  # empty without a test split: records then carry test_f1 = None
        self.test_reach = self._check_reach(gold_reach(self.test, self.id2label), "test")
        self._finish_setup()

    def _check_reach(self, reach: GoldReach, split: str) -> GoldReach:
        """Say how many gold entities of ``split`` the model cannot see; refuse when it sees none."""
        if reach.out_of_reach:
            print(f"layerfusion: {reach.message(split, self.settings.max_length)}", file=sys.stderr)
        if reach.entities and reach.out_of_reach == reach.entities:
            raise ValueError(
                f"--max-length {self.settings.max_length}: none of the {reach.entities} {split} gold "
                "entities is within the model's reach, every F1 would be 0; raise --max-length"
            )
        return reach

    @property
    def num_types(self) -> int:
        """``C`` of the N-shot protocol: the entity types of the train split (never dev's or test's)."""
        return len(self.data.train_entity_types)

    def load_model(self, seed: int) -> torch.nn.Module:
        return load_token_classifier(self.settings.model, len(self.labels), seed=seed)

    def check_shots(self, shots: Iterable[int]) -> None:
        check_sample_sizes(self.settings, shots, len(self.data.train), self.num_types)

    def train_sample(self, shots: int, trial: int) -> list[dict]:
        """The encoded training sentences of a trial (raises if the train split is too small)."""
        check_sample_sizes(self.settings, [shots], len(self.data.train), self.num_types)
        if self.settings.train_sentences:  # a fixed sentence budget: K sentences = "K shots" of 1 type
            size, types = self.settings.train_sentences, 1
        else:
            size, types = shots, self.num_types
        sample_trial = 0 if self.settings.fixed_sample else trial
        sample = sample_shots(self.data.train, size, types, sample_seed(shots, sample_trial))
        return encode_ner(self.tokenizer, sample, self.label2id, self.settings.max_length)

    def head_positions(self) -> KeptPositions:
        return LABELLED_POSITIONS

    def scorer_of(self, features: Sequence[dict]) -> SpanScorer:
        return SpanScorer(features, self.id2label)

    metric_name = "f1"

    def unit_scorer(
        self, sample: Sequence[dict], labels: torch.Tensor, example: torch.Tensor
    ) -> SentenceSpanCounts:
        """The true few-shot protocol's scorer of a sample's rows: micro-F1 from each sentence's counts."""
        return SentenceSpanCounts(SpanScorer(sample, self.id2label))

    def test_score(self, predicted: torch.Tensor) -> float:
        """Micro-F1 of predictions of every labelled test word, in order."""
        if getattr(self, "_test_scorer", None) is None:
            self._test_scorer = SpanScorer(self.test, self.id2label)
        return self._test_scorer.f1(predicted)

    def probe_inputs(
        self, states: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block outputs at the labelled positions (the first sub-word of each word), row after
        row as seqeval's scorer takes them: ``(labelled, L, d)``, and their tags ``(labelled,)``."""
        read = labelled_positions(batch)  # (batch, seq)
        return states_at(states, read), batch["labels"][read]

    def runner(self, model: torch.nn.Module, located, cache, count: int | None = None) -> Runner:
        if count is None:
            return TokenClassifierRunner(model, located, cache)
        return StackedRunner(model, count, located, cache)

    def record_fields(self, result: RunResult, train: Sequence[dict]) -> dict[str, Any]:
        """NER's fields: ``best_f1``/``dev_f1`` (best dev micro-F1), ``best_epoch``, ``curve``,
        ``seconds``, ``test_f1`` (test micro-F1 of the best dev epoch; ``None`` without a test
        split), the sample's size and the gold entities of dev and test (and how many are out of
        reach)."""
        ner = NerRunResult.of(result)
        return {
            **ner.to_dict(),
            "dev_f1": ner.best_f1,
            "train_sentences": len(train),
            "dev_entities": self.dev_reach.entities,
            "dev_entities_out_of_reach": self.dev_reach.out_of_reach,
            "test_entities": self.test_reach.entities,
            "test_entities_out_of_reach": self.test_reach.out_of_reach,
        }
