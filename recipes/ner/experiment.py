"""One experiment (model + data) and the runs of its cells: method x regime x shots x epochs x trial.

The :class:`Experiment` loads the tokenizer, encodes the dev split once and, for the FE
regime, owns the :class:`~layerfusion_recipes.core.feature_cache.FeatureCache` shared by every cell
(keeping the labelled positions only where every method of the sweep reads no other:
:data:`LABELLED_POSITIONS`, :func:`cache_positions_for`).
:meth:`Experiment.run` trains one cell and returns a JSON-ready record. Seeds: trial ``t`` draws its
N-shot sample from seed ``(t, shots)`` (so every method sees the same sample in a trial: paired comparison)
and initialises the head and fusion module from seed ``seed + t``.

Learning rates: a cell trains every LR of its regime's grid (``--lr`` values, else
:data:`DEFAULT_LR_GRIDS`); :meth:`Experiment.run_lrs` trains them together on the feature
cache (:mod:`layerfusion_recipes.ner.candidates`) and one after another otherwise. A record's ``key`` names
the cell, its own LR and the settings that change a result (:meth:`ExperimentSettings.setup`),
never the grid it ran in; :mod:`layerfusion_recipes.core.selection` picks the LR per cell on dev.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.layer import active_fusion_module, fusion_layer_of
from peft_layerfusion.registration import method_named
from peft_layerfusion.utils import eval_mode

from ..arguments import DEFAULT_LR_GRIDS, lr_grid
from ..core.feature_cache import (
    ALL_POSITIONS,
    CachePlan,
    FeatureCache,
    KeptPositions,
    plan_cache,
    storage_dtype,
)
from ..core.models import (
    PLAIN_HEAD,
    adapter_summary,
    apply_regime,
    check_head_modules,
    check_length,
    load_token_classifier,
    model_skeleton,
    regime_options,
)
from ..data.gold import GoldReach, gold_reach
from ..data.readers import IGNORE_INDEX, NerDataset, encode_ner
from ..data.sampling import sample_shots
from ..data.sources import NerColumns, load_ner
from .candidates import StackedRunner
from .training import RunResult, TokenClassifierRunner, TrainSettings, fit, train_token_classifier


def _labelled_positions(feature: dict) -> list[int]:
    return [position for position, label in enumerate(feature["labels"]) if label != IGNORE_INDEX]


# what the loss and the scorer read: the labelled positions (the first sub-word of each word)
LABELLED_POSITIONS = KeptPositions("labelled", _labelled_positions)
CACHE_POSITIONS: dict[str, KeptPositions] = {"all": ALL_POSITIONS, "labelled": LABELLED_POSITIONS}
FE_DEFAULT_LR = 1e-3  # frozen encoder: only fusion + head train, a larger LR is usual
FT_DEFAULT_LR = 5e-5  # the paper's max LR when the encoder trains
# ExperimentSettings fields that change a result, hence part of every record key
SETUP_FIELDS = (
    "model",
    "data",
    "language",
    "max_length",
    "batch_size",
    "eval_every",
    "seed",
    "head_modules",
    "method_options",
    "dev_limit",
    "test_limit",
    "train_sentences",
    "fixed_sample",
)


@dataclass(frozen=True)
class Cell:
    """One point of the grid; ``key`` identifies it in a results file."""

    method: str
    regime: str
    shots: int
    epochs: int
    trial: int

    @property
    def key(self) -> str:
        """The cell's place in the grid (a record key adds its LR and setup: :func:`record_key`)."""
        return f"{self.method}|{self.regime}|{self.shots}|{self.epochs}|{self.trial}"


def record_key(cell: Cell, lr: float, setup: str) -> str:
    """Key of the record of ``cell`` trained at max LR ``lr`` under settings ``setup``.

    Example:
        >>> record_key(Cell("dwatt", "fe", 8, 25, 0), 1e-3, "3f2a9c0d1e4b")
        'dwatt|fe|8|25|0|lr=0.001|3f2a9c0d1e4b'
    """
    return f"{cell.key}|lr={float(lr)!r}|{setup}"


@dataclass
class ExperimentSettings:
    """Everything about an experiment except the grid.

    Args:
        model: Encoder name or path (``AutoModelForTokenClassification``).
        data: Dataset directory, file, or Hub name (see ``data.sources.load_ner``).
        language: WikiANN language.
        tokens_column: Token column of tabular data (``None``: by convention).
        tags_column: Tag column of tabular data (``None``: by convention).
        label_names: Names of integer tags (``None``: the ``ClassLabel`` names).
        tag_scheme: Tag scheme of the data (``auto`` detects; converted to IOB2).
        max_length: Tokenizer max length.
        lr: Max LR, or several (LR selection on dev); ``None``: the regime's
            :data:`DEFAULT_LR_GRIDS` in a sweep, 1e-3 (FE) / 5e-5 (others) for a lone :meth:`Experiment.run`.
        batch_size: Training batch size (16 for NER in the paper).
        eval_every: Dev evaluation every k epochs.
        seed: Base seed.
        use_cache: Train FE cells on the feature cache.
        cache_dir: Folder persisting the feature cache (shared by sweep workers).
        head_modules: Modules of the head that train with the fusion (``modules_to_save``).
        method_options: Extra options of the regimes and fusion configs (e.g. ``lora_r``, ``d_pos``);
            ``adapter_reduction_factor`` sizes the AdapterHub regimes and reaches only them
            (:func:`~layerfusion_recipes.core.models.regime_options`).
        dev_limit: Evaluate on at most this many dev sentences (``None``: all).
        test_limit: Score at most this many test sentences (``None``: all).
        train_sentences: Sample exactly this many training sentences per trial instead of
            ``N * C`` (e.g. a fixed 100-sentence budget); ``None``: the N-shot protocol.
        fixed_sample: Every trial trains on trial 0's sample (only init and order change);
            the paper's WikiANN protocol. ``False``: a new sample each trial.
        cache_dtype: Storage dtype of the feature cache (``float32``: exact; ``bfloat16`` or
            ``float16``: half the memory, cast back to float32 on use, results change a little);
            part of the setup (:meth:`setup_fields`) when not float32.
        cache_positions: Positions the feature cache keeps (:data:`CACHE_POSITIONS`): ``all``, or
            ``labelled`` (only those the loss and the scorer read; every cached method must read
            no other: :func:`cache_positions_for`). The same records either way.
    """

    model: str
    data: str
    language: str | None = None
    tokens_column: str | None = None
    tags_column: str | None = None
    label_names: tuple[str, ...] | None = None
    tag_scheme: str = "auto"
    max_length: int = 128
    lr: float | Sequence[float] | None = None
    batch_size: int = 16
    eval_every: int = 1
    seed: int = 0
    use_cache: bool = True
    cache_dir: str | None = None
    head_modules: tuple[str, ...] = ("classifier",)
    method_options: dict[str, Any] = field(default_factory=dict)
    dev_limit: int | None = None
    test_limit: int | None = None
    train_sentences: int | None = None
    fixed_sample: bool = False
    cache_dtype: str = "float32"
    cache_positions: str = "all"

    def lr_for(self, regime: str) -> float:
        """The LR of a lone run: the only ``lr`` given, else 1e-3 (FE) / 5e-5 (other regimes)."""
        if self.lr is None:
            return FE_DEFAULT_LR if regime == "fe" else FT_DEFAULT_LR
        grid = self.lr_grid(regime)
        if len(grid) != 1:
            raise ValueError(f"lr has {len(grid)} values {list(grid)}: pick one for a lone run")
        return grid[0]

    def lr_grid(self, regime: str) -> tuple[float, ...]:
        """The LR candidates of ``regime``: the ``lr`` values (sorted, unique) or its default grid.

        Example:
            >>> ExperimentSettings(model="m", data="d", lr=[3e-3, 1e-3]).lr_grid("fe")
            (0.001, 0.003)
        """
        try:
            return lr_grid(self.lr, DEFAULT_LR_GRIDS, regime, "lr")
        except ValueError as error:  # the whole value, as the YAML file or caller gave it
            raise ValueError(f"lr must be one or more finite numbers > 0, got {self.lr!r}") from error

    def setup(self) -> str:
        """Fingerprint (12 hex digits) of the settings that change a result (:data:`SETUP_FIELDS`).

        Existing model and data paths count by their absolute real path.

        Example:
            >>> ExperimentSettings("m", "d").setup() == ExperimentSettings("m", "e").setup()
            False
        """
        text = json.dumps(self.setup_fields(), sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def setup_fields(self) -> dict[str, Any]:
        """The :data:`SETUP_FIELDS` of these settings (paths made absolute), as stored in records."""
        fields = {name: getattr(self, name) for name in SETUP_FIELDS}
        for name in ("model", "data"):
            if os.path.exists(fields[name]):
                fields[name] = os.path.realpath(fields[name])
        fields["head_modules"] = list(fields["head_modules"])
        if self.cache_dtype != "float32":  # rounded features: other results (float32 keeps older keys)
            fields["cache_dtype"] = self.cache_dtype
        return fields


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


def sample_seed(shots: int, trial: int) -> int:
    """Seed of the N-shot sample of a trial (stable across processes and Python versions)."""
    return int(hashlib.sha1(f"{shots}|{trial}".encode()).hexdigest()[:8], 16)


class Experiment:
    """Model + data, prepared once; :meth:`run` trains one :class:`Cell`.

    Args:
        settings: See :class:`ExperimentSettings`.
        dataset: Already loaded data (otherwise loaded from ``settings.data``).

    Example:
        >>> experiment = Experiment(ExperimentSettings(model=path, data="ner.txt"))
        >>> experiment.run(Cell("dwatt", "fe", shots=8, epochs=10, trial=0))["best_f1"]
    """

    def __init__(self, settings: ExperimentSettings, dataset: NerDataset | None = None) -> None:
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.settings = settings
        columns = NerColumns(
            settings.tokens_column, settings.tags_column, settings.label_names, settings.tag_scheme
        )
        self.data = dataset if dataset is not None else load_ner(settings.data, settings.language, 0, columns)
        self.labels = self.data.labels
        self.label2id = {label: i for i, label in enumerate(self.labels)}
        self.id2label = dict(enumerate(self.labels))
        self.tokenizer = AutoTokenizer.from_pretrained(settings.model)
        special = self.tokenizer.num_special_tokens_to_add()
        if settings.max_length <= special:
            raise ValueError(
                f"--max-length {settings.max_length} leaves no room for a word: the tokenizer adds "
                f"{special} special tokens; use --max-length > {special}"
            )
        # before any run: what would fail on the first long sentence, or train no head, silently
        classifier = AutoModelForTokenClassification
        skeleton = model_skeleton(classifier, settings.model, num_labels=len(self.labels))
        check_length("--max-length", settings.max_length, skeleton, self.tokenizer)
        check_head_modules(skeleton, settings.head_modules)
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
        self.setup = settings.setup()
        storage_dtype(settings.cache_dtype)  # a bad value stops here, naming the allowed ones
        self._cache: FeatureCache | None = None
        self._cache_filled = False

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

    def cache(self) -> FeatureCache:
        """The feature cache (built on first use, dev and test sets filled)."""
        cache = self._cache_object()
        if not self._cache_filled:
            cache.fill(self.dev + self.test)
            self._cache_filled = True
        return cache

    def _cache_object(self) -> FeatureCache:
        """The feature cache, built (not filled) on first use."""
        if self._cache is None:
            base = load_token_classifier(self.settings.model, len(self.labels), seed=0)
            self._cache = FeatureCache(
                base,
                find_encoder_blocks(base),
                self.settings.model,
                self.settings.max_length,
                self.settings.cache_dir,
                tokenizer=self.tokenizer,
                positions=CACHE_POSITIONS[self.settings.cache_positions],
                dtype=self.settings.cache_dtype,
            )
        return self._cache

    def cached_cells(self, cells: Iterable[Cell]) -> list[Cell]:
        """The cells of ``cells`` that replay the feature cache (FE, unless ``use_cache`` is off)."""
        return [cell for cell in cells if self.settings.use_cache and cell.regime == "fe"]

    def prefill_cache(self, cells: Iterable[Cell]) -> None:
        """Fill the feature cache with everything ``cells`` read, in the order their runs would (the
        dev and test sets, then each cell's training sample), then release the encoder that fills it:
        its weights leave memory, and the runs replay the cache alone.

        Example:
            >>> experiment.prefill_cache(grid_cells(grid))  # then experiment.run(...) for each cell
        """
        cached = self.cached_cells(cells)
        if not cached:
            return
        cache = self.cache()
        for cell in cached:
            cache.fill(self.train_sample(cell.shots, cell.trial))
        cache.release_encoder()

    def cache_plan(self, cells: Iterable[Cell]) -> CachePlan | None:
        """What the feature cache of ``cells`` will hold, before anything is computed: the dev and
        test sets and every training sample of the cells that replay it (``None``: none does).

        Example:
            >>> experiment.cache_plan(grid_cells(grid)).nbytes  # e.g. 2211840000
        """
        cached = self.cached_cells(cells)
        if not cached:
            return None
        features = [*self.dev, *self.test]
        for shots, trial in dict.fromkeys((cell.shots, cell.trial) for cell in cached):
            features += self.train_sample(shots, trial)
        if self._cache is not None:
            return self._cache.plan(features)
        base = load_token_classifier(self.settings.model, len(self.labels), seed=0)  # not kept
        positions = CACHE_POSITIONS[self.settings.cache_positions]
        return plan_cache(base, find_encoder_blocks(base), positions, self.settings.cache_dtype, features)

    def build(self, cell: Cell) -> tuple[torch.nn.Module, Any]:
        """The model of a cell (init seeded by the trial) and its encoder blocks."""
        base = load_token_classifier(
            self.settings.model, len(self.labels), seed=self.settings.seed + cell.trial
        )
        located = find_encoder_blocks(base)
        torch.manual_seed(self.settings.seed + cell.trial)
        model = apply_regime(
            base,
            cell.method,
            cell.regime,
            head_modules=self.settings.head_modules,
            **regime_options(cell.regime, self.settings.method_options),
        )
        return model, located

    def run(self, cell: Cell, use_cache: bool | None = None, lr: float | None = None) -> dict[str, Any]:
        """Train one cell at one LR (default :meth:`ExperimentSettings.lr_for`); returns its record.

        The record holds ``key`` (:func:`record_key`), the cell fields, ``lr``, ``dev_f1`` (best
        dev F1, also ``best_f1``), ``best_epoch``, ``test_f1`` (test F1 of the best dev epoch;
        ``None`` without a test split), ``curve``, ``setup`` and ``settings`` (what the key hashes).
        """
        use_cache = self.settings.use_cache if use_cache is None else use_cache
        lr = self.settings.lr_for(cell.regime) if lr is None else float(lr)
        train = self.train_sample(cell.shots, cell.trial)
        model, located = self.build(cell)
        cache = self._filled_cache(train, cell) if use_cache and cell.regime == "fe" else None
        runner = TokenClassifierRunner(model, located, cache)
        result = train_token_classifier(
            runner, train, self.dev, self.id2label, self.train_settings(cell, lr), test=self.test or None
        )
        return self._record(cell, lr, result, runner, len(train))

    def run_lrs(
        self, cell: Cell, lrs: Sequence[float], use_cache: bool | None = None
    ) -> list[dict[str, Any]]:
        """Train one cell at each LR of ``lrs``; one record per LR, each equal to :meth:`run`'s.

        On the feature cache (FE) the candidates of a token-wise method (the plain head, Average,
        ScalarMix, Concat, DWAtt) train together in one pass (a
        :class:`~layerfusion_recipes.ner.candidates.StackedRunner` in
        :func:`~layerfusion_recipes.ner.training.fit`); otherwise one after another: the uncached
        regimes, and R+n, whose extra block has no vmap batching rule for CPU attention (4 LRs
        stacked measured at 8x one LR; one after another they cost 4x). See :meth:`iter_lrs`.

        Example:
            >>> [r["dev_f1"] for r in experiment.run_lrs(Cell("dwatt", "fe", 8, 25, 0), [1e-3, 1e-2])]
        """
        return list(self.iter_lrs(cell, lrs, use_cache))

    def iter_lrs(
        self, cell: Cell, lrs: Sequence[float], use_cache: bool | None = None
    ) -> Iterator[dict[str, Any]]:
        """:meth:`run_lrs`, yielding each record as soon as it exists: where the LRs run one after
        another, a sweep stores each run when it ends (an interrupted cell keeps its finished LRs).

        Example:
            >>> for record in experiment.iter_lrs(Cell("none", "lora", 8, 25, 0), [1e-3, 1e-2]):
            ...     append_record("results.jsonl", record)
        """
        use_cache = self.settings.use_cache if use_cache is None else use_cache
        if len(lrs) < 2 or not lrs_train_together(cell, use_cache):
            for lr in lrs:
                yield self.run(cell, use_cache, lr)
            return
        model, located = self.build(cell)
        train = self.train_sample(cell.shots, cell.trial)
        runner = StackedRunner(model, len(lrs), located, self._filled_cache(train, cell))
        results = fit(
            runner, train, self.dev, self.id2label, self.train_settings(cell, lrs[0]), lrs, self.test or None
        )
        for index, (lr, result) in enumerate(zip(lrs, results, strict=True)):
            runner.load_candidate(index)  # the model as this candidate's lone run leaves it
            yield self._record(cell, float(lr), result, runner, len(train))

    def train_settings(self, cell: Cell, lr: float) -> TrainSettings:
        """The optimisation settings of ``cell`` at max LR ``lr``."""
        return TrainSettings(
            epochs=cell.epochs,
            lr=lr,
            batch_size=self.settings.batch_size,
            eval_every=self.settings.eval_every,
            seed=self.settings.seed + cell.trial,
        )

    def _filled_cache(self, train: list[dict], cell: Cell) -> FeatureCache:
        if self.settings.cache_positions != "all" and not reads_labelled_only(cell.method):
            raise ValueError(
                f"method {cell.method} reads every position but the feature cache keeps the "
                f"{self.settings.cache_positions} ones only; use cache_positions='all'"
            )
        cache = self.cache()
        cache.fill(train)
        return cache

    def _record(
        self, cell: Cell, lr: float, result: RunResult, runner: TokenClassifierRunner, train_size: int
    ) -> dict[str, Any]:
        """The JSON-ready record of one run (``runner.model`` in the state the run left it)."""
        record = {
            "key": record_key(cell, lr, self.setup),
            **asdict(cell),
            **result.to_dict(),
            "dev_f1": result.best_f1,
            "train_sentences": train_size,
            "dev_entities": self.dev_reach.entities,
            "dev_entities_out_of_reach": self.dev_reach.out_of_reach,
            "test_entities": self.test_reach.entities,
            "test_entities_out_of_reach": self.test_reach.out_of_reach,
            "lr": lr,
            "cached": runner.cache is not None,
            "model": self.settings.model,
            "data": self.data.name,
            "setup": self.setup,
            "settings": self.settings.setup_fields(),
            "pid": os.getpid(),
        }
        if self.settings.method_options:
            record["method_options"] = dict(self.settings.method_options)  # e.g. {"lora_r": 114}
        adapter = adapter_summary(runner.model)
        if adapter is not None:  # AdapterHub regimes: e.g. {"kind": "seqbn", "reduction_factor": 16.0, ...}
            record["adapter"] = adapter
        layer = fusion_layer_of(runner.model)
        if layer is not None and active_fusion_module(runner.model).shows_depth_attention:
            plain = TokenClassifierRunner(runner.model, runner.located, runner.cache)
            record["depth_attention"] = depth_attention_profile(plain, self.dev)
            record["fused_layers"] = list(next(iter(layer.fused_layers.values())))
        return record


def lrs_train_together(cell: Cell, use_cache: bool) -> bool:
    """Whether :meth:`Experiment.run_lrs` trains the LRs of ``cell`` together in one pass: on the
    feature cache (FE) with the plain head or a token-wise fusion method (the registry's flag).

    Example:
        >>> lrs_train_together(Cell("extra_layers", "fe", 8, 25, 0), use_cache=True)
        False
    """
    if not (use_cache and cell.regime == "fe"):
        return False
    return reads_labelled_only(cell.method)


def reads_labelled_only(method: str) -> bool:
    """Whether a run of ``method`` reads the encoder's states at the labelled positions only: the
    plain head and the token-wise fusion methods (the registry's flag); R+n attends over every
    position.

    Example:
        >>> reads_labelled_only("dwatt"), reads_labelled_only("extra_layers")
        (True, False)
    """
    return method == PLAIN_HEAD or method_named(method).token_wise


def cache_positions_for(methods: Iterable[str]) -> str:
    """The :data:`CACHE_POSITIONS` a feature cache shared by ``methods`` keeps: ``labelled`` when
    every one of them reads no other position, else ``all``.

    Example:
        >>> cache_positions_for(["none", "concat"]), cache_positions_for(["none", "extra_layers"])
        ('labelled', 'all')
    """
    return "labelled" if all(reads_labelled_only(method) for method in methods) else "all"


@torch.no_grad()
def depth_attention_profile(
    runner: TokenClassifierRunner, features: list[dict], batch_size: int = 64
) -> list[float]:
    """DWAtt's depth-attention weights ``a_n`` averaged over the labelled tokens of ``features``.

    Returns one weight per fused layer (they sum to 1).

    Example:
        >>> depth_attention_profile(TokenClassifierRunner(model), dev_features)  # e.g. [0.1, 0.05, ..., 0.4]
    """
    module = active_fusion_module(runner.model)
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[1].states[-1]))
    total, count = None, 0
    device = next(runner.model.parameters()).device  # the device its run trained it on
    with eval_mode(runner.model):
        try:
            for start in range(0, len(features), batch_size):
                _, labels = runner.logits(features[start : start + batch_size], device)
                # the runner fuses the labelled positions only: the module saw exactly those
                weights = module.depth_attention(seen.pop()).flatten(0, -2)  # (labelled tokens, K)
                if weights.shape[0] != int((labels != IGNORE_INDEX).sum()):
                    raise RuntimeError("depth attention was not computed on the labelled tokens only")
                summed = weights.sum(0)  # (K,)
                total = summed if total is None else total + summed
                count += weights.shape[0]
        finally:
            handle.remove()
    return (total / max(count, 1)).tolist()
