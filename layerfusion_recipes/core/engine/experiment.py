"""One few-shot experiment (model + data) and the runs of its cells, whatever the task.

A task (``ner``, ``classify``) subclasses :class:`FewShotExperiment` with what is its own: how its
model is loaded (:meth:`~FewShotExperiment.load_model`), how a trial's training sample is drawn and
encoded, which positions its loss reads (:meth:`~FewShotExperiment.runner`), how a split is scored
(:meth:`~FewShotExperiment.scorer_of`) and the fields its records add. Everything else is here: the
model of a cell (init seeded by the trial, the method and regime applied), the feature cache of the
FE regime (filled with the dev and test examples once, each trial's sample as it comes, or all of it
first by :meth:`~FewShotExperiment.prefill_cache`; keeping the positions the task's head reads,
:meth:`~FewShotExperiment.head_positions`, where every method of the sweep reads no other:
:func:`cache_positions_for`; its bytes predicted by :meth:`~FewShotExperiment.cache_plan`), a cell at
one LR or every LR of its grid (together on the cache where the method allows it), and the record
of a run. Its settings derive from :class:`TaskSettings` (the fields that change a result are part
of every record key).

Learning rates: a cell trains every LR of its regime's grid (``lr`` values, else
:data:`~layerfusion_recipes.core.options.grids.DEFAULT_LR_GRIDS`);
:mod:`layerfusion_recipes.core.results.selection`
picks the LR per cell on dev.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import AutoTokenizer

from peft_layerfusion.config import DepthMixConfig
from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.layer import active_fusion_module, fusion_layer_of
from peft_layerfusion.names import METHOD_NAMES
from peft_layerfusion.registration import METHODS

from ..cache.cache_files import path_fingerprint
from ..cache.feature_cache import (
    ALL_POSITIONS,
    CachePlan,
    FeatureCache,
    KeptPositions,
    TrainingPlan,
    candidates_per_pass,
    plan_cache,
)
from ..errors import UserError
from ..memory import collect_garbage
from ..models.models import (
    adapter_summary,
    apply_regime,
    check_head_modules,
    check_length,
    regime_options,
    trainable_parameters,
)
from ..options.grids import (
    DEFAULT_LR_GRIDS,
    EVERY_EPOCH,
    FE_DEFAULT_LR,
    FT_DEFAULT_LR,
    LrGrids,
    lrs_by_method,
)
from ..options.locations import check_model
from ..options.options import DEFAULT_CACHE_DTYPE, check_cache_dtype
from ..probes.probes import PROBE_SETTINGS
from ..results.cells import Cell, lrs_train_together, reads_head_positions_only, record_key
from ..results.records import fingerprint
from .fitting import RunResult, TrainSettings, fit
from .loop import restore, snapshot
from .plan import SweepPlan
from .runner import (
    Runner,
    Scorer,
    StackedRunner,
    candidate_groups,
    depth_attention_profile,
    reads_block_calls,
)

# the TaskSettings fields that change a result in every task (each task's SETUP_FIELDS holds them,
# after its model, data and data-reading fields)
SHARED_SETUP_FIELDS = (
    "max_length",
    "batch_size",
    "eval_every",
    "seed",
    "head_modules",
    "method_options",
    "dev_limit",
    "test_limit",
)


@dataclass
class TaskSettings:
    """What every few-shot task's settings have, except the grid.

    Args:
        model: Model name or path.
        data: Dataset directory, file, or Hub name.
        max_length: Tokenizer max length.
        lr: Each method's max LRs (LR selection on dev), held as
            :data:`~layerfusion_recipes.core.options.grids.LrGrids` ``{method: (LR, ...)}``, ascending;
            given as one LR or several (every method's) or as a mapping ``{method: LRs}`` (the demo's,
            :data:`~layerfusion_recipes.core.options.grids.DEMO_AXES`), made into that by
            :func:`~layerfusion_recipes.core.options.grids.lrs_by_method`. A method it leaves out: the
            regime's :data:`DEFAULT_LR_GRIDS` in a sweep, 1e-3 (FE) / 5e-5 (others) for a lone run.
        batch_size: Training batch size.
        eval_every: Dev evaluation every k epochs.
        seed: Base seed.
        use_cache: Train FE cells on the feature cache.
        cache_dir: Folder persisting the feature cache (shared by sweep workers).
        head_modules: Modules of the head that train with the fusion (``modules_to_save``).
        method_options: Extra options of the regimes and fusion configs (e.g. ``lora_r``, ``d_pos``);
            ``adapter_reduction_factor`` sizes the AdapterHub regimes and reaches only them
            (:func:`~layerfusion_recipes.core.models.models.regime_options`).
        dev_limit: Evaluate on at most this many dev examples (``None``: all).
        test_limit: Score at most this many test examples (``None``: all).
        fixed_sample: Every trial trains on trial 0's sample (only init and order change).
        cache_dtype: Storage dtype of the feature cache (``float32``: exact; ``bfloat16`` or
            ``float16``: half the memory, cast back to float32 on use, results change a little);
            part of the setup (:meth:`setup_fields`) when not float32.
        train_memory: GB the training state of a cell's stacked LR candidates may hold (20 B per
            trainable parameter of each:
            :func:`~layerfusion_recipes.core.cache.feature_cache.candidates_per_pass`);
            the LRs train in several passes of fewer candidates when all of them would hold more.
            ``None``: one pass of all. The same records either way (not part of the setup). With
            it, the heap's freed pages are given back after every training step and evaluation batch.
        probe_start: Start each trial's fusion of a method with a ``start_layer`` option one-hot on the
            block whose probe scored best on dev in that trial (``--probe-start``); part of the setup
            with the probes' settings (:data:`~layerfusion_recipes.core.probes.probes.PROBE_SETTINGS`).
        probe_fuse: Fuse each trial's ``K`` best probed blocks (``--probe-fuse K``: the blocks whose
            probes scored best on dev in that trial, as ``layers``) in every method with a ``layers``
            option; part of the setup with the probes' settings. ``None``: the method's own layers.

    These are the options as the user gave them (flags, YAML, defaults); what a sweep learns at run
    time (the cache's positions, the resident limit, the probes' choices) is its
    :class:`~layerfusion_recipes.core.engine.plan.SweepPlan`, passed beside them.
    """

    # the fields that change a result, hence part of every record key (each task names its own)
    SETUP_FIELDS: ClassVar[tuple[str, ...]] = ()
    # the name of a plan's ``cache_positions`` that keeps only the positions the task's head reads
    READ_POSITIONS: ClassVar[str] = "read"
    # the task's name: its records say it (a results file holds one task's: core.sweeps.tasks.check_task)
    TASK: ClassVar[str] = ""

    model: str
    data: str
    max_length: int = 128
    lr: LrGrids = field(default_factory=dict)
    batch_size: int = 16
    eval_every: int = EVERY_EPOCH
    seed: int = 0
    use_cache: bool = True
    cache_dir: str | None = None
    head_modules: tuple[str, ...] | None = ("classifier",)
    method_options: dict[str, Any] = field(default_factory=dict)
    dev_limit: int | None = None
    test_limit: int | None = None
    fixed_sample: bool = False
    cache_dtype: str = DEFAULT_CACHE_DTYPE
    train_memory: float | None = None
    probe_start: bool = False
    probe_fuse: int | None = None

    def __post_init__(self) -> None:
        check_cache_dtype(self.cache_dtype)  # a bad value (flag, YAML or script) stops here, in one line
        self.lr = lrs_by_method(self.lr, METHOD_NAMES)  # one type, whatever form it was given in
        fuse = self.probe_fuse
        if fuse is not None and (isinstance(fuse, bool) or not isinstance(fuse, int) or fuse < 1):
            raise UserError(f"probe_fuse: {fuse!r}; allowed: an integer >= 1 (the best blocks to fuse)")

    def lr_for(self, regime: str, method: str) -> float:
        """The LR of a lone run: the only LR of ``method``'s grid (:meth:`lr_grid`), else 1e-3 (FE) /
        5e-5 (other regimes) where ``lr`` gives it none."""
        if method not in self.lr:
            return FE_DEFAULT_LR if regime == "fe" else FT_DEFAULT_LR
        grid = self.lr_grid(regime, method)
        if len(grid) != 1:
            raise ValueError(f"lr has {len(grid)} values {list(grid)}: pick one for a lone run")
        return grid[0]

    def lr_grid(self, regime: str, method: str) -> tuple[float, ...]:
        """The LR candidates of ``method`` under ``regime``: its ``lr`` values (ascending, unique) or the
        regime's default grid.

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> NerSettings(model="m", data="d", lr=[3e-3, 1e-3]).lr_grid("fe", "dwatt")
            (0.001, 0.003)
            >>> NerSettings(model="m", data="d", lr={"none": [3e-2, 1e-2]}).lr_grid("fe", "none")
            (0.01, 0.03)
        """
        return self.lr.get(method) or DEFAULT_LR_GRIDS[regime]

    def start_layer(self, cell: Cell, plan: SweepPlan) -> int | None:
        """The block ``cell``'s fusion starts one-hot on (``--probe-start``: its trial's best probe on
        dev, ``plan.probe_starts``), or ``None``: no probe start, a method without ``start_layer``, not
        FE, or the probes not yet run (a memory plan builds the model before them).

        Raises:
            UserError: when the sweep's probes have no trial of ``cell``'s shots, epochs and trial.

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> settings = NerSettings("m", "d", probe_start=True)
            >>> plan = SweepPlan(probe_starts={(8, 25, 0): 4})
            >>> [settings.start_layer(Cell(m, "fe", 8, 25, 0), plan) for m in ("layer_mix", "dwatt")]
            [4, None]
        """
        if not self.probe_start or not takes_option(cell.method, "start_layer"):
            return None
        return probed(plan.probe_starts, cell, "--probe-start")

    def probe_layers(self, cell: Cell, plan: SweepPlan) -> list[int] | None:
        """The blocks ``cell``'s fusion fuses (``--probe-fuse K``: its trial's ``K`` best probes on dev,
        ``plan.probe_ranks``, ascending), or ``None``: no probe fuse, a method without ``layers``, not
        FE, or the probes not yet run.

        Raises:
            UserError: when the sweep's probes have no trial of ``cell``'s shots, epochs and trial.

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> settings = NerSettings("m", "d", probe_fuse=2)
            >>> plan = SweepPlan(probe_ranks={(8, 25, 0): [4, 2, 3]})
            >>> [settings.probe_layers(Cell(method, "fe", 8, 25, 0), plan) for method in ("average", "none")]
            [[2, 4], None]
        """
        if self.probe_fuse is None or not is_depth_mix(cell.method):
            return None
        ranked = probed(plan.probe_ranks, cell, "--probe-fuse")
        return None if ranked is None else sorted(ranked[: self.probe_fuse])

    def run_key(self, cell: Cell, lr: float, setup: str, plan: SweepPlan) -> str:
        """The key of ``cell``'s run at ``lr`` under ``setup`` (:meth:`setup`), with the block it starts
        on where it has one (:meth:`start_layer`) and the blocks it fuses where the probes chose them
        (:meth:`probe_layers`; both from ``plan``): new probes that move either make another run.

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> settings = NerSettings("m", "d", probe_start=True)
            >>> plan = SweepPlan(probe_starts={(8, 25, 0): 4})
            >>> settings.run_key(Cell("layer_mix", "fe", 8, 25, 0), 0.01, "3f2a9c0d1e4b", plan)
            'layer_mix|fe|8|25|0|lr=0.01|3f2a9c0d1e4b|...start=4'
        """
        return record_key(cell, lr, setup, self.start_layer(cell, plan), self.probe_layers(cell, plan))

    def setup(self) -> str:
        """Fingerprint (12 hex digits) of the settings that change a result (:attr:`SETUP_FIELDS`).

        Existing model and data paths count by their absolute real path and their content
        (:meth:`content_fingerprints`).

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> NerSettings("m", "d").setup() == NerSettings("m", "e").setup()
            False
        """
        return fingerprint(self.setup_fields())

    def setup_fields(self) -> dict[str, Any]:
        """The :attr:`SETUP_FIELDS` of these settings (paths made absolute), as stored in records."""
        fields = {name: getattr(self, name) for name in self.SETUP_FIELDS}
        for name in ("model", "data"):
            if os.path.exists(fields[name]):
                fields[name] = os.path.realpath(fields[name])
        if fields.get("head_modules") is not None:
            fields["head_modules"] = list(fields["head_modules"])
        content = self.content_fingerprints()
        if content:  # local files: new weights or data at the same path give other records
            fields["content"] = content
        fields["cache_dtype"] = self.cache_dtype  # rounded features give other results
        if self.probe_start:  # the probes' settings; each run's start block is in its own key (run_key)
            fields["probe_start"] = PROBE_SETTINGS
        if self.probe_fuse is not None:  # the same for the fused blocks (probe_layers), and their count
            fields["probe_fuse"] = PROBE_SETTINGS
            fields["probe_fuse_count"] = self.probe_fuse
        return fields

    def content_fingerprints(self) -> dict[str, str]:
        """``{"model": ..., "data": ...}``: the content fingerprints of the paths of ``model`` and
        ``data`` that exist here (:func:`~layerfusion_recipes.core.cache.cache_files.path_fingerprint`, read
        again on every call: a file is hashed again only once its size or time changed); a Hub name
        has none.

        Example:
            >>> from layerfusion_recipes.ner.experiment import NerSettings
            >>> NerSettings(model="hub/model", data=ner_data).content_fingerprints()  # a folder here
            {'data': '876cbf8e32de0987'}
        """
        paths = {name: getattr(self, name) for name in ("model", "data")}
        return {name: path_fingerprint(path) or "" for name, path in paths.items() if os.path.exists(path)}

    def make_experiment(self, plan: SweepPlan | None = None) -> FewShotExperiment:
        """The experiment of these settings under ``plan`` (``None``: the empty plan of a lone run; each
        task's settings build their own)."""
        raise NotImplementedError


class FewShotExperiment:
    """Model + data, prepared once by the task's ``__init__``; :meth:`run` trains one :class:`Cell`.

    A task's ``__init__(settings, dataset=None)`` takes its settings and, optionally, its data
    already loaded (otherwise it loads ``settings.data``), then sets ``settings``, ``tokenizer``,
    ``dev``, ``test`` (encoded, possibly empty), ``labels`` (the label names, ids ``0..C-1``),
    ``data_name`` and ``setup`` (``settings.setup()``), and ``plan``, what a sweep learned
    (:class:`~layerfusion_recipes.core.engine.plan.SweepPlan`; the empty one by default, a sweep gives it
    anew as it learns more); the task implements :meth:`load_model`,
    :meth:`train_sample`, :meth:`check_shots`, :meth:`scorer_of`, :meth:`runner`,
    :meth:`record_fields` and :meth:`probe_inputs`.
    """

    settings: TaskSettings
    plan: SweepPlan
    tokenizer: Any
    dev: list[dict]
    test: list[dict]
    labels: list[str]
    data_name: str
    setup: str
    _cache: FeatureCache | None = None
    _cache_filled: bool = False

    # --------------------------------------------------------------- set up by every task's __init__
    def _prepare(
        self, settings: TaskSettings, data: Any, labels: Sequence[str], plan: SweepPlan | None = None
    ) -> None:
        """What a task's ``__init__`` sets first: the settings, the sweep's plan (``None``: the empty
        one), the data (with its ``name``), the label names and their ids ``0..C-1``, the tokenizer (a
        model that cannot load, e.g. a grid file's, is said in one line first:
        :func:`~layerfusion_recipes.core.options.locations.check_model`)."""
        self.settings, self.data, self.data_name = settings, data, data.name
        self.plan = SweepPlan() if plan is None else plan
        self.labels = list(labels)
        self.label2id = {label: i for i, label in enumerate(self.labels)}
        check_model(settings.model)
        self.tokenizer = AutoTokenizer.from_pretrained(settings.model)

    def _check_model(self, skeleton: nn.Module, head_modules: Sequence[str]) -> None:
        """Refuse before any run what would fail on the first long text (``--max-length`` past the
        model's positions) or train no head (``head_modules`` not in the model)."""
        check_length("--max-length", self.settings.max_length, skeleton, self.tokenizer)
        check_head_modules(skeleton, head_modules)

    def _finish_setup(self) -> None:
        """What a task's ``__init__`` sets last: the setup fingerprint, an empty feature cache."""
        self.setup = self.settings.setup()
        self._cache = None

    # --------------------------------------------------------------- the task's own
    def load_model(self, seed: int) -> nn.Module:
        """The pretrained model with its task head drawn from ``seed`` (same seed, same head)."""
        raise NotImplementedError

    def train_sample(self, shots: int, trial: int) -> list[dict]:
        """The encoded training examples of a trial (raises if the train split is too small)."""
        raise NotImplementedError

    def check_shots(self, shots: Iterable[int]) -> None:
        """Refuse shot sizes the train split cannot give, before any run (one line)."""
        raise NotImplementedError

    def scorer_of(self, features: Sequence[dict]) -> Scorer:
        """The :class:`~layerfusion_recipes.core.engine.fitting.Scorer` of a split's examples."""
        raise NotImplementedError

    def runner(self, model: nn.Module, located, cache, count: int | None = None) -> Runner:
        """A runner of ``model`` (a stacked one of ``count`` candidates when given)."""
        raise NotImplementedError

    # the true few-shot protocol (core.sweeps.true_few_shot): the metric's name, per unit and on test
    metric_name: str = ""

    def unit_scorer(self, sample: Sequence[dict], labels: torch.Tensor, example: torch.Tensor) -> Any:
        """The :class:`peft_layerfusion.few_shot.Scorer` of a sample's rows (``example``: each row's)."""
        raise NotImplementedError

    def test_score(self, predicted: torch.Tensor) -> float:
        """The task's metric of predictions of every test row, in order."""
        raise NotImplementedError

    def record_fields(self, result: RunResult, train: Sequence[dict]) -> dict[str, Any]:
        """The task's fields of a run's record (its scores, its sample's size...)."""
        raise NotImplementedError

    def head_positions(self) -> KeptPositions:
        """The positions of an example the task's head and loss read (what a feature cache keeps
        where every method of the sweep reads no other)."""
        raise NotImplementedError

    def probe_inputs(
        self, states: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the layer probes (:mod:`~layerfusion_recipes.core.probes.probes`) read of a batch: the block
        outputs ``(L, batch, seq, d)`` at the positions the task's head reads, ``(read, L, d)``, and
        their labels ``(read,)``, in the order the task's scorer takes its predictions."""
        raise NotImplementedError

    def head_modules(self) -> tuple[str, ...]:
        """The head modules that train with the fusion (``settings.head_modules``)."""
        return tuple(self.settings.head_modules or ())

    # --------------------------------------------------------------- shared
    def kept_positions(self) -> KeptPositions:
        """The positions the feature cache keeps (``plan.cache_positions``)."""
        return ALL_POSITIONS if self.plan.cache_positions == "all" else self.head_positions()

    def cache(self) -> FeatureCache:
        """The feature cache (built on first use, dev and test examples filled)."""
        cache = self._cache_object()
        if not self._cache_filled:
            cache.fill(self.dev + self.test)
            self._cache_filled = True
        return cache

    def _cache_object(self) -> FeatureCache:
        """The feature cache, built (not filled) on first use."""
        if self._cache is None:
            base = self.load_model(seed=0)
            self._cache = FeatureCache(
                base,
                find_encoder_blocks(base),
                self.settings.model,
                self.settings.max_length,
                self.settings.cache_dir,
                tokenizer=self.tokenizer,
                positions=self.kept_positions(),
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
            >>> from layerfusion_recipes.core.results.cells import grid_cells
            >>> experiment.prefill_cache(grid_cells(grid))  # then experiment.run(...) for each cell
            >>> len(experiment.cache()), experiment.cache().base_model is None  # sentences; encoder gone
            (36, True)
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
            >>> from layerfusion_recipes.core.results.cells import grid_cells
            >>> plan = experiment.cache_plan(grid_cells(grid))  # dev, test, 2 trials' samples of 2 x 3
            >>> print(plan.describe())
            feature cache: 36 sentences, 329 all positions x 3 blocks x 32 x 4 B (float32) = 0.00 GB,
            model 0.00 GB
            >>> plan.nbytes  # 329 x 3 x 32 x 4
            126336
        """
        cached = self.cached_cells(cells)
        if not cached:
            return None
        features = [*self.dev, *self.test]
        for shots, trial in dict.fromkeys((cell.shots, cell.trial) for cell in cached):
            features += self.train_sample(shots, trial)
        if self._cache is not None:
            return self._cache.plan(features)
        base = self.load_model(seed=0)  # not kept
        return plan_cache(
            base, find_encoder_blocks(base), self.kept_positions(), self.settings.cache_dtype, features
        )

    def build(self, cell: Cell, start_layer: int | None = None) -> tuple[nn.Module, Any]:
        """The model of a cell (init seeded by the trial) and its encoder blocks. The models of the runs
        before are collected first (:func:`~layerfusion_recipes.core.memory.collect_garbage`: any reference
        cycle would keep a whole model in memory until Python's collector ran).

        Args:
            cell: The run.
            start_layer: The block a method with ``start_layer`` starts on (the true few-shot protocol's
                selected block); default: ``--probe-start``'s (:meth:`TaskSettings.start_layer`).
        """
        collect_garbage()
        base = self.load_model(seed=self.settings.seed + cell.trial)
        located = find_encoder_blocks(base)
        torch.manual_seed(self.settings.seed + cell.trial)
        options = regime_options(cell.regime, self.settings.method_options)
        start = self.settings.start_layer(cell, self.plan)
        if start_layer is not None and takes_option(cell.method, "start_layer"):
            start = start_layer
        if start is not None:
            options["start_layer"] = start
        layers = self.settings.probe_layers(cell, self.plan)
        if layers is not None:
            options["layers"] = layers
        model = apply_regime(base, cell.method, cell.regime, head_modules=self.head_modules(), **options)
        return model, located

    def run(self, cell: Cell, use_cache: bool | None = None, lr: float | None = None) -> dict[str, Any]:
        """Train one cell at one LR (default ``settings.lr_for``); returns its record (:meth:`_record`)."""
        use_cache = self.settings.use_cache if use_cache is None else use_cache
        lr = self.settings.lr_for(cell.regime, cell.method) if lr is None else float(lr)
        train = self.train_sample(cell.shots, cell.trial)
        model, located = self.build(cell)
        cache = self.filled_cache(train, cell) if use_cache and cell.regime == "fe" else None
        runner = self.runner(model, located, self.replayable(cache, model))
        settings = self.train_settings(cell)
        [result] = fit(runner, train, self.dev, settings, self.scorer_of, [lr], self.test or None)
        return self._record(cell, lr, result, runner, train)

    def run_lrs(
        self, cell: Cell, lrs: Sequence[float], use_cache: bool | None = None
    ) -> list[dict[str, Any]]:
        """Train one cell at each LR of ``lrs``; one record per LR, each equal to :meth:`run`'s.

        On the feature cache (FE) the candidates of a token-wise method (the plain head, Average,
        ScalarMix, Concat, DWAtt) train together in one pass
        (:class:`~layerfusion_recipes.core.engine.runner.StackedRunner`), or in several passes of fewer
        candidates when their training state exceeds ``settings.train_memory``
        (:meth:`pass_size`); otherwise one after another
        (:func:`~layerfusion_recipes.core.results.cells.lrs_train_together`). See :meth:`iter_lrs`.

        Example:
            >>> records = experiment.run_lrs(Cell("dwatt", "fe", 2, 2, 0), [1e-2, 3e-2])  # in one pass
            >>> [r["lr"] for r in records], records[0]["key"]
            ([0.01, 0.03], 'dwatt|fe|2|2|0|lr=0.01|...')
            >>> all(0 <= r["dev_f1"] <= 1 and r["cached"] for r in records)
            True
        """
        return list(self.iter_lrs(cell, lrs, use_cache))

    def iter_lrs(
        self, cell: Cell, lrs: Sequence[float], use_cache: bool | None = None
    ) -> Iterator[dict[str, Any]]:
        """:meth:`run_lrs`, yielding each record as soon as it exists: where the LRs run one after
        another (or in passes), a sweep stores each run (each pass) when it ends (an interrupted cell
        keeps its finished LRs).

        Every pass starts from the built model's initial parameters; a candidate's record is the same
        bitwise whatever the pass it trains in (its computations keep their shapes: only the leading
        candidate dimension of the stacked ones changes).

        Example:
            >>> from layerfusion_recipes.core.results.records import append_record
            >>> for record in experiment.iter_lrs(Cell("none", "lora", 2, 2, 0), [1e-3, 1e-2]):
            ...     append_record("results.jsonl", record)  # each as soon as its run ends
            True
            True
        """
        use_cache = self.settings.use_cache if use_cache is None else use_cache
        if len(lrs) < 2 or not lrs_train_together(cell, use_cache):
            for lr in lrs:
                yield self.run(cell, use_cache, lr)
            return
        model, located = self.build(cell)
        train = self.train_sample(cell.shots, cell.trial)
        cache = self.filled_cache(train, cell)
        settings = self.train_settings(cell)
        initial = snapshot(trainable_parameters(model))  # each pass starts where the built model does
        for group in candidate_groups(len(lrs), self.pass_size(model, len(lrs))):
            restore(trainable_parameters(model), initial)
            runner = self.runner(model, located, cache, count=len(group))
            assert isinstance(runner, StackedRunner)
            part = [lrs[k] for k in group]
            results = fit(runner, train, self.dev, settings, self.scorer_of, part, self.test or None)
            for index, (lr, result) in enumerate(zip(part, results, strict=True)):
                runner.load_candidate(index)  # the model as this candidate's lone run leaves it
                yield self._record(cell, float(lr), result, runner, train)
            del runner, results  # this pass's candidates and optimizer go before the next pass's

    def fit_sample(
        self,
        cell: Cell,
        lrs: Sequence[float],
        train: Sequence[dict],
        dev: Sequence[dict],
        test: Sequence[dict] | None = None,
        start_layer: int | None = None,
        eval_every: int | None = None,
    ) -> list[RunResult]:
        """``cell`` trained on ``train`` at each LR of ``lrs``, scored on ``dev`` every ``eval_every``
        epochs (default: the settings') and, with ``test``, at its best ``dev`` epoch: the runs of the
        true few-shot protocol, whose ``dev`` is a fold of the training sample. The feature cache holds
        exactly these examples: the data's dev split is never read.

        Args:
            cell: The method, regime, max epochs and trial (its seed).
            lrs: The max LRs (one candidate each; stacked in one pass where they train together).
            train: Encoded training examples.
            dev: Encoded examples scored during training.
            test: Encoded examples scored at the best ``dev`` epoch (``None``: none).
            start_layer: See :meth:`build`.
            eval_every: Score ``dev`` every this many epochs (and after the last).

        Returns:
            One :class:`~layerfusion_recipes.core.engine.fitting.RunResult` per LR, in order.
        """
        settings = self.train_settings(cell)
        if eval_every is not None:
            settings = dataclasses.replace(settings, eval_every=eval_every)
        model, located = self.build(cell, start_layer)
        cache = None
        if self.settings.use_cache and cell.regime == "fe":
            cache = self._cache_object()
            cache.fill([*train, *dev, *(test or [])])
            cache = self.replayable(cache, model)
        if len(lrs) > 1 and lrs_train_together(cell, cache is not None):
            runner = self.runner(model, located, cache, count=len(lrs))
            return fit(runner, train, dev, settings, self.scorer_of, list(lrs), test or None)
        results: list[RunResult] = []
        for lr in lrs:
            if results:  # each LR from the built model's start
                model, located = self.build(cell, start_layer)
            runner = self.runner(model, located, cache)
            results += fit(runner, train, dev, settings, self.scorer_of, [lr], test or None)
        return results

    def pass_size(self, model: nn.Module, count: int) -> int:
        """How many of ``count`` stacked LR candidates of ``model`` (its trainable parameters, one copy
        each) train together within ``settings.train_memory`` GB (all of them without it)."""
        budget = self.settings.train_memory
        return candidates_per_pass(count, trainable_count(model), None if budget is None else budget * 1e9)

    def training_plan(self, cells: Iterable[Cell]) -> TrainingPlan | None:
        """The training state of the largest pass of LR candidates among ``cells`` that replay the
        feature cache (the method with the most trainable parameters; each method's model built
        once, not kept); ``None``: none replays it.

        Example:
            >>> from layerfusion_recipes.core.results.cells import grid_cells
            >>> experiment.training_plan(grid_cells(grid)).describe()  # DWAtt's, larger than the plain head's
            'training 2 of 2 LRs per pass x 0.01M dwatt parameters x 20 B = 0.00 GB'
        """
        plans = []
        for cell in {cell.method: cell for cell in self.cached_cells(cells)}.values():
            model, _ = self.build(cell)
            count = len(self.settings.lr_grid(cell.regime, cell.method))
            together = lrs_train_together(cell, True)
            per_pass = self.pass_size(model, count) if together else 1
            plans.append(TrainingPlan(cell.method, trainable_count(model), count, per_pass))
            del model  # gone before the next method's is built
        return max(plans, key=lambda plan: plan.nbytes, default=None)

    def train_settings(self, cell: Cell) -> TrainSettings:
        """The optimisation settings of ``cell``; its max LRs go to
        :func:`~layerfusion_recipes.core.engine.fitting.fit` beside them."""
        return TrainSettings(
            epochs=cell.epochs,
            batch_size=self.settings.batch_size,
            eval_every=self.settings.eval_every,
            seed=self.settings.seed + cell.trial,
            # a memory budget: the peak first (after every step); else above the sweep's memory line
            release_above=0 if self.settings.train_memory is not None else self.plan.resident_limit,
        )

    def filled_cache(self, train: Sequence[dict], cell: Cell | None = None) -> FeatureCache:
        """The feature cache (:meth:`cache`) with ``train`` filled too.

        Args:
            train: The examples to fill (those already cached are not computed again).
            cell: The run that reads it: its method must read no position the cache leaves out
                (``plan.cache_positions``). ``None``: a reader of the head's positions only
                (the layer probes, :mod:`~layerfusion_recipes.core.probes.probes`).

        Raises:
            ValueError: ``cell``'s method reads every position but the cache keeps the head's only.
        """
        if (
            cell is not None
            and self.plan.cache_positions != "all"
            and not reads_head_positions_only(cell.method)
        ):
            raise ValueError(
                f"method {cell.method} reads every position but the feature cache keeps the "
                f"{self.plan.cache_positions} ones only; give it a plan with cache_positions='all'"
            )
        cache = self.cache()
        cache.fill(train)
        return cache

    def replayable(self, cache: FeatureCache | None, model: nn.Module) -> FeatureCache | None:
        """``cache``, or ``None`` where ``model`` reads the last block's call (R+n) and a replay of
        ``cache`` cannot give the real one (:attr:`FeatureCache.replays_block_calls`): that run trains
        without the cache, and one line on stderr says why.

        Example:
            >>> model, _ = experiment.build(Cell("extra_layers", "fe", 2, 2, 0))
            >>> experiment.replayable(cache, model) is cache  # BERT: a replay gives the real call
            True
        """
        if cache is None or cache.replays_block_calls or not reads_block_calls(model):
            return cache
        print(
            f"layerfusion: {cache.model_name}: a replay of the feature cache cannot give the last block the "
            "arguments of a real forward, which R+n's extra blocks read: this run trains without the cache",
            file=sys.stderr,
            flush=True,
        )
        return None

    def _record(
        self, cell: Cell, lr: float, result: RunResult, runner: Runner, train: Sequence[dict]
    ) -> dict[str, Any]:
        """The JSON-ready record of one run (``runner.model`` in the state the run left it): its key
        (:func:`~layerfusion_recipes.core.results.cells.record_key`), the cell, the LR, the task's fields
        (:meth:`record_fields`), what ran it and the settings its key hashes; DWAtt's mean depth
        attention on dev where the method shows it."""
        record = {
            "key": self.settings.run_key(cell, lr, self.setup, self.plan),
            **asdict(cell),
            **self.record_fields(result, train),
            "lr": lr,
            "cached": runner.cache is not None,
            "selection": "dev",  # the large-dev protocol: LR and epoch chosen on the dev split
            **self.provenance(),
        }
        start = self.settings.start_layer(cell, self.plan)
        if start is not None:  # --probe-start: the block this run's mix started on
            record["start_layer"] = start
        layers = self.settings.probe_layers(cell, self.plan)
        if layers is not None:  # --probe-fuse: the blocks this run fuses
            record["probe_layers"] = layers
        adapter = adapter_summary(runner.model)
        if adapter is not None:  # AdapterHub regimes: e.g. {"kind": "seqbn", "reduction_factor": 16.0, ...}
            record["adapter"] = adapter
        layer = fusion_layer_of(runner.model)
        if layer is not None:
            module = active_fusion_module(runner.model)
            if module.shows_depth_attention:
                record["depth_attention"] = depth_attention_profile(runner.plain(), self.dev)
            if hasattr(module, "mix_weights"):  # learned layer weights (ScalarMix's s), whatever the input
                record["mix_weights"] = module.mix_weights().tolist()
            if "depth_attention" in record or "mix_weights" in record:
                record["fused_layers"] = list(next(iter(layer.fused_layers.values())))
        return record

    def provenance(self) -> dict[str, Any]:
        """What every record of this experiment says besides its scores: the model, the data, the
        setup fingerprint and the settings it hashes, the process, the method options."""
        fields = {
            "model": self.settings.model,
            "data": self.data_name,
            "setup": self.setup,
            "settings": self.settings.setup_fields(),
            "pid": os.getpid(),
        }
        if self.settings.method_options:
            fields["method_options"] = dict(self.settings.method_options)  # e.g. {"lora_r": 114}
        return fields


ScorerFactory = Callable[[Sequence[dict]], Scorer]


def probed(choices: Mapping[tuple[int, int, int], Any] | None, cell: Cell, flag: str) -> Any:
    """What the probes chose for ``cell``'s trial (``choices``: by ``(shots, epochs, trial)``, a sweep's
    plan's), or ``None``: not FE, or the probes not yet run (a memory plan builds the model before them).

    Raises:
        UserError: when the sweep's probes have no trial of ``cell``'s shots, epochs and trial.

    Example:
        >>> probed({(8, 25, 0): 4}, Cell("layer_mix", "fe", 8, 25, 0), "--probe-start")
        4
        >>> probed({(8, 25, 0): 4}, Cell("layer_mix", "fe", 8, 25, 1), "--probe-start")  # trial 1: none
        Traceback (most recent call last):
        layerfusion_recipes.core.errors.UserError: --probe-start: no layer probes for shots=8 epochs=25 ...
    """
    if choices is None or cell.regime != "fe":
        return None
    found = choices.get((cell.shots, cell.epochs, cell.trial))
    if found is None:
        raise UserError(
            f"{flag}: no layer probes for shots={cell.shots} epochs={cell.epochs} "
            f"trial={cell.trial}; the sweep trains them with --probe-layers"
        )
    return found


def takes_option(method: str, option: str) -> bool:
    """Whether ``method``'s config has the field ``option`` (``start_layer``: a probe-guided start).

    Example:
        >>> takes_option("layer_mix", "start_layer"), takes_option("dwatt", "start_layer")
        (True, False)
    """
    known = {m.name: m for m in METHODS}
    return method in known and option in {f.name for f in dataclasses.fields(known[method].config_cls)}


def is_depth_mix(method: str) -> bool:
    """Whether ``method`` mixes the states of the blocks its ``layers`` name (a
    :class:`~peft_layerfusion.config.DepthMixConfig`: ``--probe-fuse`` chooses them).

    Example:
        >>> is_depth_mix("average"), is_depth_mix("extra_layers"), is_depth_mix("none")
        (True, False, False)
    """
    known = {m.name: m for m in METHODS}
    return method in known and issubclass(known[method].config_cls, DepthMixConfig)


def trainable_count(model: nn.Module) -> int:
    """The trainable parameters of ``model`` (one LR candidate's: fusion module + head in FE)."""
    return sum(p.numel() for p in trainable_parameters(model))


def cache_positions_for(methods: Iterable[str], read: str = TaskSettings.READ_POSITIONS) -> str:
    """The ``cache_positions`` of a feature cache shared by ``methods`` (a sweep's plan's): ``read``
    (the task's :attr:`TaskSettings.READ_POSITIONS`) when every one of them reads no other position than the
    head's, else ``all``.

    Example:
        >>> cache_positions_for(["none", "concat"]), cache_positions_for(["none", "extra_layers"])
        ('read', 'all')
    """
    return read if all(reads_head_positions_only(method) for method in methods) else "all"
