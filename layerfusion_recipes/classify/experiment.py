"""Few-shot sentence and sentence-pair classification over the shared few-shot core.

What is the task's own: its data (:func:`~layerfusion_recipes.data.texts.load_texts`: files, folders,
``save_to_disk`` folders, Hub names; columns by convention or named), the N-per-class sample
(stratified; ``--shots all``: the whole train split), the classifier and the positions its head reads
(:mod:`layerfusion_recipes.classify.models`), accuracy and macro-F1
(:class:`~layerfusion_recipes.classify.scoring.ClassScorer`). Everything else (the model of a cell,
the feature cache of FE, every LR of a cell, together where the method allows it, the record) is
:class:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment`'s, so a sweep, its resume,
``accelerate`` splitting, LR selection and tables work as for NER.

Seeds: trial ``t`` draws its N-per-class sample from seed ``(shots, t)`` (every method sees the same
sample in a trial: paired comparisons) and initialises the head and the fusion module from
``seed + t``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..core.cache.feature_cache import ALL_POSITIONS, FIRST_POSITION, LAST_POSITION, KeptPositions
from ..core.engine.experiment import SHARED_SETUP_FIELDS, FewShotExperiment, TaskSettings
from ..core.engine.fitting import RunResult
from ..core.engine.plan import SweepPlan
from ..core.engine.runner import Runner, StackedRunner
from ..core.probes.probes import states_at
from ..core.results.cells import FULL_TRAIN, sample_seed
from ..data.sampling import check_per_class, describe_short_classes, sample_per_class
from ..data.texts import TextColumns, TextDataset, TextExample, label_counts, load_texts
from .models import (
    POOLINGS,
    classifier_skeleton,
    load_sequence_classifier,
    mean_pool,
    position_mask,
    read_positions,
)
from .scoring import METRICS, ClassCounts, ClassScorer

# what the feature cache keeps of an example where every method reads the head's positions only
CACHED_POSITIONS = {"first": FIRST_POSITION, "last": LAST_POSITION, "all": ALL_POSITIONS}
# ClassifySettings fields that change a result, hence part of every record key
SETUP_FIELDS = (
    "model",
    "data",
    "text_column",
    "text_pair_column",
    "label_column",
    *SHARED_SETUP_FIELDS,
    "fixed_sample",
    "pooling",
    "metric",
)


@dataclass
class ClassifySettings(TaskSettings):
    """Everything about a classification experiment except the grid (see
    :class:`~layerfusion_recipes.core.engine.experiment.TaskSettings` for the shared fields).

    Args:
        text_column: Text column (``None``: by convention).
        text_pair_column: Second text of a pair (``None``: by convention, or single texts).
        label_column: Label column (``None``: by convention).
        pooling: ``model`` (the model's own sequence-classification head: first token for BERT-like
            encoders, last real token for decoders) or ``mean`` (mean over the real tokens).
        metric: The dev metric that picks each run's best epoch and each cell's LR: ``accuracy`` or
            ``macro_f1`` (the other one is reported too).
        head_modules: ``None``: what the checkpoint lacks (the new head; see
            :func:`~layerfusion_recipes.classify.models.new_modules`).
    """

    SETUP_FIELDS: ClassVar[tuple[str, ...]] = SETUP_FIELDS
    TASK: ClassVar[str] = "classify"

    head_modules: tuple[str, ...] | None = None
    batch_size: int = 8
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    pooling: str = "model"
    metric: str = "accuracy"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling not in POOLINGS:
            raise ValueError(f"--pooling {self.pooling!r}: allowed {', '.join(POOLINGS)}")
        if self.metric not in METRICS:
            raise ValueError(f"--metric {self.metric!r}: allowed {', '.join(METRICS)}")

    def make_experiment(self, plan: SweepPlan | None = None) -> ClassifyExperiment:
        """The :class:`ClassifyExperiment` of these settings under a sweep's ``plan`` (what its workers
        build)."""
        return ClassifyExperiment(self, plan=plan)


@dataclass(frozen=True)
class ReadPositions:
    """The positions a runner fuses: those the head reads (``first``, ``last`` or ``all``), from the
    batch's attention mask (:func:`~layerfusion_recipes.classify.models.position_mask`)."""

    name: str

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return position_mask(self.name, batch["attention_mask"])


def set_pad_token(tokenizer) -> int:
    """The tokenizer's pad id, giving it one (its end-of-sequence token, else its unknown token) when it
    has none (Llama); the batches pad with it and a decoder's head skips it.

    Raises:
        ValueError: The tokenizer has neither a pad, an end-of-sequence nor an unknown token.
    """
    if tokenizer.pad_token_id is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError(f"the tokenizer of {tokenizer.name_or_path} has no pad, end or unknown token")
        tokenizer.pad_token = fallback
    return tokenizer.pad_token_id


def encode_texts(
    tokenizer, examples: Sequence[TextExample], label2id: dict[str, int], max_length: int
) -> list[dict[str, Any]]:
    """Tokenize examples (pairs as the tokenizer joins them), truncated to ``max_length`` sub-words.

    Returns one dict per example: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the
    tokenizer makes them: a BERT pair's segments), ``labels`` (the label id).

    Example:
        >>> from layerfusion_recipes.data.texts import TextExample
        >>> encode_texts(tokenizer, [TextExample("a b", None, "pos")], {"pos": 1}, 16)[0]["labels"]
        1
    """
    if not examples:
        return []
    texts = [example.text for example in examples]
    pairs = [example.pair or "" for example in examples] if examples[0].pair is not None else None
    encoded = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded]
    return [
        {**{key: encoded[key][index] for key in keys}, "labels": label2id[example.label]}
        for index, example in enumerate(examples)
    ]


def truncated(tokenizer, examples: Sequence[TextExample], max_length: int) -> int:
    """How many ``examples`` have more than ``max_length`` sub-words (cut by :func:`encode_texts`)."""
    if not examples:
        return 0
    texts = [example.text for example in examples]
    pairs = [example.pair or "" for example in examples] if examples[0].pair is not None else None
    lengths = tokenizer(texts, pairs, truncation=False, return_length=True, verbose=False)["length"]
    return sum(length > max_length for length in lengths)


def limited(examples: list[TextExample], limit: int | None) -> list[TextExample]:
    """At most ``limit`` examples, drawn with seed 0 and kept in file order (a file sorted by class
    still gives every class); all of them without a limit."""
    if not limit or limit >= len(examples):
        return examples
    return [examples[i] for i in sorted(random.Random(0).sample(range(len(examples)), limit))]


class ClassifyExperiment(FewShotExperiment):
    """Sentence classification as a :class:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment`
    of :class:`ClassifySettings` (and, optionally, a :class:`TextDataset` already loaded).

    Example:
        >>> from layerfusion_recipes.classify.settings import ClassifySettings
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> experiment = ClassifyExperiment(ClassifySettings(model=model_path, data=text_data, lr=[1e-2]))
        >>> record = experiment.run(Cell("dwatt", "fe", shots=2, epochs=2, trial=0))
        >>> 0.0 <= record["test_accuracy"] <= 1.0, record["lr"]
        (True, 0.01)
    """

    def __init__(
        self, settings: ClassifySettings, dataset: TextDataset | None = None, plan: SweepPlan | None = None
    ) -> None:
        columns = TextColumns(settings.text_column, settings.text_pair_column, settings.label_column)
        data = dataset if dataset is not None else load_texts(settings.data, columns)
        if len(data.labels) < 2:
            raise ValueError(
                f"{data.name}: train has one class only ({list(data.labels)}); nothing to classify"
            )
        self._prepare(settings, data, data.labels, plan)
        self.pad_id = set_pad_token(self.tokenizer)
        skeleton = classifier_skeleton(settings.model, len(self.labels), settings.pooling)
        self._check_model(skeleton, settings.head_modules or ())
        self.positions = read_positions(skeleton, settings.pooling)
        self.dev = self._encoded(limited(self.data.dev, settings.dev_limit), "dev")
        self.test = self._encoded(limited(self.data.test, settings.test_limit), "test")
        self._finish_setup()
        self._head: tuple[str, ...] | None = None
        self._train_features: dict[int, list[dict]] = {}  # the whole train split, encoded once
        self._said_short: set[int] = set()  # the shot sizes whose classes taken whole were said
        self._cache = None

    def _encoded(self, examples: list[TextExample], split: str) -> list[dict]:
        """``examples`` encoded, sorted by length (less padding in evaluation batches; the scores do
        not depend on order); how many were cut at ``--max-length`` is said on stderr."""
        cut = truncated(self.tokenizer, examples, self.settings.max_length)
        if cut:
            print(
                f"layerfusion: {split}: {cut} of {len(examples)} examples are longer than --max-length "
                f"{self.settings.max_length} sub-words; the model sees their first "
                f"{self.settings.max_length}",
                file=sys.stderr,
            )
        features = encode_texts(self.tokenizer, examples, self.label2id, self.settings.max_length)
        self._check_last_tokens(features, split)
        return sorted(features, key=lambda f: len(f["input_ids"]))

    def _check_last_tokens(self, features: Sequence[dict], split: str) -> None:
        """A decoder's head reads the last token that is not the pad id: no example may end with it."""
        if self.positions != "last":
            return
        ending = sum(feature["input_ids"][-1] == self.pad_id for feature in features)
        if ending:
            raise ValueError(
                f"{split}: {ending} examples end with the tokenizer's pad token (id {self.pad_id}), which "
                "the decoder's classification head skips: give the tokenizer a pad token it never adds "
                "(tokenizer.pad_token) and save it with the model"
            )

    # --------------------------------------------------------------- the task's own
    def load_model(self, seed: int) -> nn.Module:
        model, head = load_sequence_classifier(
            self.settings.model, len(self.labels), seed, self.settings.pooling, self.pad_id
        )
        self._head = head
        return model

    def head_modules(self) -> tuple[str, ...]:
        """``--head-modules``, else the modules the checkpoint lacks (known once a model is loaded)."""
        if self.settings.head_modules:
            return tuple(self.settings.head_modules)
        assert self._head is not None, "head_modules() before load_model()"
        return self._head

    def class_counts(self) -> dict[str, int]:
        """Train examples per class, in label order."""
        return label_counts(self.data.train, self.labels)

    def check_shots(self, shots: Iterable[int]) -> None:
        """Before any run: refuse an N larger than the largest class of train (one line); say once on
        stderr which classes an N takes whole, having fewer examples
        (:func:`~layerfusion_recipes.data.sampling.check_per_class`)."""
        counts = self.class_counts()
        for n in sorted(set(shots) - {FULL_TRAIN}):
            short = check_per_class(counts, n)
            if short and n not in self._said_short:
                self._said_short.add(n)
                print(f"layerfusion: {describe_short_classes(short, n, len(counts))}", file=sys.stderr)

    def train_sample(self, shots: int, trial: int) -> list[dict]:
        """The encoded training examples of a trial: N of each class (all of a class that has fewer; the
        same for every method of the trial), or the whole train split for
        :data:`~layerfusion_recipes.core.results.cells.FULL_TRAIN`."""
        if shots == FULL_TRAIN:
            if FULL_TRAIN not in self._train_features:
                self._train_features[FULL_TRAIN] = self._encode_train(self.data.train)
            return self._train_features[FULL_TRAIN]
        self.check_shots([shots])
        sample_trial = 0 if self.settings.fixed_sample else trial
        seed = sample_seed(shots, sample_trial)
        sample = sample_per_class(self.data.train, shots, self.labels, lambda example: example.label, seed)
        return self._encode_train(sample)

    def _encode_train(self, examples: Sequence[TextExample]) -> list[dict]:
        features = encode_texts(self.tokenizer, examples, self.label2id, self.settings.max_length)
        self._check_last_tokens(features, "train")
        return features

    def scorer_of(self, features: Sequence[dict]) -> ClassScorer:
        return ClassScorer(features, len(self.labels), self.settings.metric)

    @property
    def metric_name(self) -> str:
        return self.settings.metric

    def unit_scorer(self, sample: Sequence[dict], labels: torch.Tensor, example: torch.Tensor) -> ClassCounts:
        """The true few-shot protocol's scorer of a sample's rows (one per example)."""
        return ClassCounts(labels, len(self.labels), self.settings.metric)

    def test_score(self, predicted: torch.Tensor) -> float:
        """The metric of predictions of every test example, in order."""
        return self.scorer_of(self.test).scores(predicted.unsqueeze(0))[0][self.settings.metric]

    def head_positions(self) -> KeptPositions:
        """The pooled position the head reads (``first``, ``last``), or every one (``all``: mean pooling)."""
        return CACHED_POSITIONS[self.positions]

    def probe_inputs(
        self, states: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block outputs where the head reads them, one per example: at its first or last real
        token (``(batch, L, d)``), or their mean over the real tokens (mean pooling); and the labels
        ``(batch,)``."""
        mask = batch["attention_mask"]  # (batch, seq)
        if self.positions == "all":
            by_position = states.permute(1, 2, 0, 3)  # (batch, seq, L, d)
            pooled = mean_pool(by_position.flatten(2), mask)  # (batch, L * d)
            return pooled.unflatten(-1, by_position.shape[2:]), batch["labels"]  # (batch, L, d)
        return states_at(states, position_mask(self.positions, mask)), batch["labels"]

    def runner(self, model: nn.Module, located, cache, count: int | None = None) -> Runner:
        options = {"positions": ReadPositions(self.positions), "pad_id": self.pad_id}
        if count is None:
            return Runner(model, located, cache, **options)
        return StackedRunner(model, count, located, cache, **options)

    def record_fields(self, result: RunResult, train: Sequence[dict]) -> dict[str, Any]:
        """The task's fields: ``metric`` (the one that selects), ``metrics``, ``best_epoch``, ``curve``,
        ``seconds``, ``dev_accuracy``/``dev_macro_f1`` (at the best dev epoch) and
        ``test_accuracy``/``test_macro_f1`` (of its checkpoint; ``None`` without a test split), the
        sizes of the sample and the splits, the labels, the head modules that train and the positions
        the head reads."""
        metrics = list(ClassScorer([], len(self.labels), self.settings.metric).metrics)
        return {
            "metric": result.metric,
            "metrics": metrics,
            "best_epoch": result.best_epoch,
            "curve": result.curve,
            "seconds": result.seconds,
            **result.split_scores(metrics),
            "train_examples": len(train),
            "dev_examples": len(self.dev),
            "test_examples": len(self.test),
            "labels": self.labels,
            "head": list(self.head_modules()),
            "read_positions": self.positions,
        }
