"""NER over the shared few-shot core: one experiment (model + data) and the runs of its cells.

The :class:`NerExperiment` loads the tokenizer, encodes the dev and test splits once and, for the FE
regime, owns the feature cache shared by every cell (keeping the labelled positions only where every
method of the sweep reads no other: :data:`LABELLED_POSITIONS`, :func:`cache_positions_for`;
:class:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment` does the rest). What is NER's own:
the token classifier, the N-shot sample (``N * C`` sentences uniformly, C = entity types;
:func:`sample_size`), the loss at the labelled positions
(:class:`~layerfusion_recipes.ner.training.TokenClassifierRunner`), seqeval's micro-F1
(:class:`~layerfusion_recipes.ner.scoring.SpanScorer`) and the gold entities the model cannot reach.
A plain tag set (part of speech: ``--tag-column 1`` of CoNLL-2003) is a tagging task of the same
shape: C counts its tags, and token accuracy scores it
(:class:`~layerfusion_recipes.ner.scoring.TokenAccuracyScorer`; records name the metric, ``accuracy``).

Seeds (:mod:`layerfusion_recipes.core.results.cells`): trial ``t`` draws its N-shot sample from seed
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

from ..core.batches import IGNORE_INDEX
from ..core.cache.feature_cache import KeptPositions
from ..core.engine import experiment as core_experiment
from ..core.engine.experiment import SHARED_SETUP_FIELDS, FewShotExperiment, TaskSettings
from ..core.engine.fitting import RunResult
from ..core.engine.plan import SweepPlan
from ..core.engine.runner import Runner, labelled_positions
from ..core.probes.probes import states_at
from ..core.results.cells import Cell, lrs_train_together, reads_head_positions_only, record_key, sample_seed
from ..data.gold import GoldReach, gold_reach
from ..data.readers import NerDataset, encode_ner
from ..data.sampling import sample_shots
from ..data.sources import NerColumns, load_ner
from ..data.tags import SPANS
from .candidates import StackedRunner
from .models import load_token_classifier, token_classifier_skeleton
from .scoring import (
    SentenceSpanCounts,
    SentenceTokenCounts,
    SpanScorer,
    TokenAccuracyScorer,
    scorer_for,
    unit_counts,
)
from .training import RunResult as NerRunResult
from .training import TokenClassifierRunner

__all__ = [
    "LABELLED_POSITIONS",
    "Cell",
    "NerExperiment",
    "NerSettings",
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

# NerSettings fields that change a result, hence part of every record key
SETUP_FIELDS = (
    "model",
    "data",
    "language",
    *SHARED_SETUP_FIELDS,
    "train_sentences",
    "fixed_sample",
)
# how the data is read: part of the key where not the default (keys made before they existed stay valid)
READING_FIELDS = ("tokens_column", "tags_column", "tag_column", "label_names", "tag_scheme")


@dataclass
class NerSettings(TaskSettings):
    """Everything about a NER experiment except the grid (the shared fields:
    :class:`~layerfusion_recipes.core.engine.experiment.TaskSettings`; ``model`` is an encoder's or a
    decoder's name or path, :func:`~layerfusion_recipes.ner.models.load_token_classifier`, ``data``
    see ``data.sources.load_ner``).

    Args:
        language: WikiANN language.
        tokens_column: Token column of tabular data (``None``: by convention).
        tags_column: Tag column of tabular data (``None``: by convention).
        label_names: Names of integer tags (``None``: the ``ClassLabel`` names).
        tag_scheme: Tag scheme of the data (``auto`` detects; converted to IOB2).
        tag_column: The 0-based column of the tags in text files (``None``: the last; CoNLL-2003: 1
            part of speech, 2 chunks).
        train_sentences: Sample exactly this many training sentences per trial instead of
            ``N * C`` (e.g. a fixed 100-sentence budget); ``None``: the N-shot protocol.

    A sweep plan's ``cache_positions`` is ``all`` or ``labelled`` (:data:`LABELLED_POSITIONS`).
    """

    SETUP_FIELDS: ClassVar[tuple[str, ...]] = SETUP_FIELDS
    READ_POSITIONS: ClassVar[str] = LABELLED_POSITIONS.name
    TASK: ClassVar[str] = "ner"

    language: str | None = None
    tokens_column: str | None = None
    tags_column: str | None = None
    label_names: tuple[str, ...] | None = None
    tag_scheme: str = "auto"
    tag_column: int | None = None
    train_sentences: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        column = self.tag_column
        if column is not None and (isinstance(column, bool) or not isinstance(column, int) or column < 0):
            raise ValueError(f"--tag-column {column!r}: a column number, 0 or more (0-based)")

    def setup_fields(self) -> dict[str, Any]:
        """The shared fields, and how the data is read (:data:`READING_FIELDS`) where not the default:
        another tag column is another task."""
        fields = super().setup_fields()
        defaults = {name: NerSettings.__dataclass_fields__[name].default for name in READING_FIELDS}
        for name in READING_FIELDS:
            value = getattr(self, name)
            if value != defaults[name]:
                fields[name] = list(value) if isinstance(value, tuple) else value
        return fields

    def make_experiment(self, plan: SweepPlan | None = None) -> NerExperiment:
        """The :class:`NerExperiment` of these settings under a sweep's ``plan`` (what its workers build)."""
        return NerExperiment(self, plan=plan)


def reads_labelled_only(method: str) -> bool:
    """Whether a run of ``method`` reads the encoder's states at the labelled positions only: the
    plain head and the token-wise fusion methods; R+n attends over every position
    (:func:`~layerfusion_recipes.core.results.cells.reads_head_positions_only`).

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


def sample_size(settings: NerSettings, shots: int, num_types: int) -> int:
    """Training sentences a trial of ``shots`` asks for: ``train_sentences`` if set, else ``N * C``."""
    return settings.train_sentences or shots * num_types


def check_sample_sizes(
    settings: NerSettings,
    shots: Iterable[int],
    train_size: int,
    num_types: int,
    types: str = "entity types",
) -> None:
    """Refuse shot sizes the train split cannot give (instead of silently training on less); ``types``
    names what C counts (``tags`` for a plain tag set).

    Raises:
        ValueError: naming the option, the value, what it asks for and the largest allowed.

    Example:
        >>> settings = NerSettings(model="m", data="d")
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
            f"--shots {n} asks for {n} x {num_types} {types} = {wanted} training sentences, the "
            f"train split has {train_size}; use --shots <= {train_size // num_types}"
        )


class NerExperiment(FewShotExperiment):
    """NER as a :class:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment` of
    :class:`NerSettings` (and, optionally, a :class:`NerDataset` already loaded).

    Example:
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> experiment = NerExperiment(NerSettings(model=model_path, data=ner_data, lr=[1e-2]))
        >>> record = experiment.run(Cell("dwatt", "fe", shots=2, epochs=2, trial=0))
        >>> record["key"], 0.0 <= record["test_f1"] <= 100.0
        ('dwatt|fe|2|2|0|lr=0.01|...', True)
    """

    def __init__(
        self, settings: NerSettings, dataset: NerDataset | None = None, plan: SweepPlan | None = None
    ) -> None:
        columns = NerColumns(
            settings.tokens_column,
            settings.tags_column,
            settings.label_names,
            settings.tag_scheme,
            settings.tag_column,
        )
        data = dataset if dataset is not None else load_ner(settings.data, settings.language, 0, columns)
        self.spans = data.tag_kind == SPANS  # else a plain tag set (part of speech): token accuracy
        self._prepare(settings, data, data.labels, plan)
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
        self.dev_reach = self._check_reach(gold_reach(self.dev, self.id2label, self.spans), "dev")
        test = self.data.test[: settings.test_limit] if settings.test_limit else self.data.test
        self.test = sorted(
            encode_ner(self.tokenizer, test, self.label2id, settings.max_length),
            key=lambda f: len(f["input_ids"]),
        )  # empty without a test split: records then carry test_f1 = None
        self.test_reach = self._check_reach(gold_reach(self.test, self.id2label, self.spans), "test")
        self._finish_setup()

    def _check_reach(self, reach: GoldReach, split: str) -> GoldReach:
        """Say how many gold entities of ``split`` the model cannot see; refuse when it sees none."""
        if reach.out_of_reach:
            print(f"layerfusion: {reach.message(split, self.settings.max_length)}", file=sys.stderr)
        if reach.entities and reach.out_of_reach == reach.entities:
            raise ValueError(
                f"--max-length {self.settings.max_length}: none of the {reach.entities} {split} gold "
                f"{reach.unit} is within the model's reach, every {'F1' if self.spans else 'accuracy'} "
                "would be 0; raise --max-length"
            )
        return reach

    @property
    def num_types(self) -> int:
        """``C`` of the N-shot protocol: the entity types of the train split (never dev's or test's);
        the tags of a plain tag set."""
        return len(self.data.train_entity_types)

    @property
    def type_word(self) -> str:
        """What ``C`` counts, in messages: ``entity types``, or ``tags`` of a plain tag set."""
        return "entity types" if self.spans else "tags"

    def load_model(self, seed: int) -> torch.nn.Module:
        return load_token_classifier(self.settings.model, len(self.labels), seed=seed)

    def check_shots(self, shots: Iterable[int]) -> None:
        check_sample_sizes(self.settings, shots, len(self.data.train), self.num_types, self.type_word)

    def train_sample(self, shots: int, trial: int) -> list[dict]:
        """The encoded training sentences of a trial (raises if the train split is too small)."""
        self.check_shots([shots])
        if self.settings.train_sentences:  # a fixed sentence budget: K sentences = "K shots" of 1 type
            size, types = self.settings.train_sentences, 1
        else:
            size, types = shots, self.num_types
        sample_trial = 0 if self.settings.fixed_sample else trial
        sample = sample_shots(self.data.train, size, types, sample_seed(shots, sample_trial))
        return encode_ner(self.tokenizer, sample, self.label2id, self.settings.max_length)

    def head_positions(self) -> KeptPositions:
        return LABELLED_POSITIONS

    def scorer_of(self, features: Sequence[dict]) -> SpanScorer | TokenAccuracyScorer:
        """seqeval's span micro-F1, or token accuracy for a plain tag set (:func:`scorer_for`)."""
        return scorer_for(features, self.id2label)

    @property
    def metric_name(self) -> str:
        """``f1`` (span micro-F1), or ``accuracy`` (token accuracy) for a plain tag set."""
        return "f1" if self.spans else "accuracy"

    def unit_scorer(
        self, sample: Sequence[dict], labels: torch.Tensor, example: torch.Tensor
    ) -> SentenceSpanCounts | SentenceTokenCounts:
        """The true few-shot protocol's scorer of a sample's rows: micro-F1 (or token accuracy) from
        each sentence's counts."""
        return unit_counts(self.scorer_of(sample))

    def test_score(self, predicted: torch.Tensor) -> float:
        """Micro-F1 (or token accuracy) of predictions of every labelled test word, in order."""
        if getattr(self, "_test_scorer", None) is None:
            self._test_scorer = self.scorer_of(self.test)
        return self._test_scorer.scores(predicted.unsqueeze(0))[0][self.metric_name]

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
        reach). A plain tag set's name their metric: ``metric`` ``accuracy``, ``dev_accuracy``,
        ``test_accuracy``, ``dev_examples`` (the dev sentences: the units of the guard's standard error)
        and the gold words (and how many are out of reach) instead of entities."""
        if not self.spans:
            return {
                "metric": result.metric,
                "best_epoch": result.best_epoch,
                "curve": result.curve,
                "seconds": result.seconds,
                **result.split_scores([result.metric]),
                "train_sentences": len(train),
                "dev_examples": len(self.dev),
                "dev_words": self.dev_reach.entities,
                "dev_words_out_of_reach": self.dev_reach.out_of_reach,
                "test_words": self.test_reach.entities,
                "test_words_out_of_reach": self.test_reach.out_of_reach,
            }
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
