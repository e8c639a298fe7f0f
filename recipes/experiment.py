"""One experiment (model + data) and the runs of its cells: method x regime x shots x epochs x trial.

The :class:`Experiment` loads the tokenizer, encodes the dev split once and, for the FE
regime, owns the :class:`~layerfusion_recipes.cache.FeatureCache` shared by every cell. :meth:`Experiment.run`
trains one cell and returns a JSON-ready record. Seeds: trial ``t`` draws its N-shot sample
from seed ``(t, shots)`` (so every method sees the same sample in a trial: paired comparison)
and initialises the head and fusion module from seed ``seed + t``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.layer import active_fusion_module, fusion_layer_of
from peft_layerfusion.utils import eval_mode

from .cache import FeatureCache
from .data import IGNORE_INDEX, NerDataset, encode_ner
from .gold import GoldReach, gold_reach
from .models import apply_regime, load_token_classifier
from .sampling import sample_shots
from .training import TokenClassifierRunner, TrainSettings, train_token_classifier

FE_DEFAULT_LR = 1e-3  # frozen encoder: only fusion + head train, a larger LR is usual
FT_DEFAULT_LR = 5e-5  # the paper's max LR when the encoder trains


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
        return f"{self.method}|{self.regime}|{self.shots}|{self.epochs}|{self.trial}"


@dataclass
class ExperimentSettings:
    """Everything about an experiment except the grid.

    Args:
        model: Encoder name or path (``AutoModelForTokenClassification``).
        data: Dataset directory, file, or Hub name (see ``data.load_ner``).
        language: WikiANN language.
        tokens_column: Token column of tabular data (``None``: by convention).
        tags_column: Tag column of tabular data (``None``: by convention).
        label_names: Names of integer tags (``None``: the ``ClassLabel`` names).
        tag_scheme: Tag scheme of the data (``auto`` detects; converted to IOB2).
        max_length: Tokenizer max length.
        lr: Max LR; ``None`` picks 1e-3 for FE and 5e-5 (paper) for the other regimes.
        batch_size: Training batch size (16 for NER in the paper).
        eval_every: Dev evaluation every k epochs.
        seed: Base seed.
        use_cache: Train FE cells on the feature cache.
        cache_dir: Folder persisting the feature cache (shared by sweep workers).
        head_modules: Modules of the head that train with the fusion (``modules_to_save``).
        method_options: Extra options of the fusion configs.
        dev_limit: Evaluate on at most this many dev sentences (``None``: all).
        train_sentences: Sample exactly this many training sentences per trial instead of
            ``N * C`` (e.g. a fixed 100-sentence budget); ``None``: the N-shot protocol.
        fixed_sample: Every trial trains on trial 0's sample (only init and order change);
            the paper's WikiANN protocol. ``False``: a new sample each trial.
    """

    model: str
    data: str
    language: str | None = None
    tokens_column: str | None = None
    tags_column: str | None = None
    label_names: tuple[str, ...] | None = None
    tag_scheme: str = "auto"
    max_length: int = 128
    lr: float | None = None
    batch_size: int = 16
    eval_every: int = 1
    seed: int = 0
    use_cache: bool = True
    cache_dir: str | None = None
    head_modules: tuple[str, ...] = ("classifier",)
    method_options: dict[str, Any] = field(default_factory=dict)
    dev_limit: int | None = None
    train_sentences: int | None = None
    fixed_sample: bool = False

    def lr_for(self, regime: str) -> float:
        if self.lr is not None:
            return self.lr
        return FE_DEFAULT_LR if regime == "fe" else FT_DEFAULT_LR


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
        from transformers import AutoTokenizer

        from .data import load_ner
        from .datasets_io import NerColumns

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
        dev = self.data.dev[: settings.dev_limit] if settings.dev_limit else self.data.dev
        # sorted by length: less padding in evaluation batches (micro-F1 does not depend on order)
        self.dev = sorted(
            encode_ner(self.tokenizer, dev, self.label2id, settings.max_length),
            key=lambda f: len(f["input_ids"]),
        )
        self.dev_reach = self._check_reach(gold_reach(self.dev, self.id2label))
        self._cache: FeatureCache | None = None

    def _check_reach(self, reach: GoldReach) -> GoldReach:
        """Say how many dev gold entities the model cannot see; refuse when it sees none."""
        if reach.out_of_reach:
            print(f"layerfusion: {reach.message('dev', self.settings.max_length)}", file=sys.stderr)
        if reach.entities and reach.out_of_reach == reach.entities:
            raise ValueError(
                f"--max-length {self.settings.max_length}: none of the {reach.entities} dev gold entities "
                "is within the model's reach, every F1 would be 0; raise --max-length"
            )
        return reach

    @property
    def num_types(self) -> int:
        return len(self.data.entity_types)

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
        """The feature cache (built on first use, dev set filled)."""
        if self._cache is None:
            base = load_token_classifier(self.settings.model, len(self.labels), seed=0)
            self._cache = FeatureCache(
                base,
                find_encoder_blocks(base),
                self.settings.model,
                self.settings.max_length,
                self.settings.cache_dir,
                tokenizer=self.tokenizer,
            )
            self._cache.fill(self.dev)
        return self._cache

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
            **self.settings.method_options,
        )
        return model, located

    def run(self, cell: Cell, use_cache: bool | None = None) -> dict[str, Any]:
        """Train one cell; returns ``{"key", cell fields, "best_f1", "best_epoch", "curve", ...}``."""
        use_cache = self.settings.use_cache if use_cache is None else use_cache
        train = self.train_sample(cell.shots, cell.trial)
        model, located = self.build(cell)
        cache = None
        if use_cache and cell.regime == "fe":
            cache = self.cache()
            cache.fill(train)
        settings = TrainSettings(
            epochs=cell.epochs,
            lr=self.settings.lr_for(cell.regime),
            batch_size=self.settings.batch_size,
            eval_every=self.settings.eval_every,
            seed=self.settings.seed + cell.trial,
        )
        result = train_token_classifier(
            TokenClassifierRunner(model, located, cache), train, self.dev, self.id2label, settings
        )
        record = {
            "key": cell.key,
            **asdict(cell),
            **result.to_dict(),
            "train_sentences": len(train),
            "dev_entities": self.dev_reach.entities,
            "dev_entities_out_of_reach": self.dev_reach.out_of_reach,
            "lr": settings.lr,
            "cached": cache is not None,
            "model": self.settings.model,
            "data": self.data.name,
            "pid": os.getpid(),
        }
        if self.settings.method_options:
            record["method_options"] = dict(self.settings.method_options)  # e.g. {"lora_r": 114}
        layer = fusion_layer_of(model)
        if cell.method == "dwatt" and layer is not None:
            record["depth_attention"] = depth_attention_profile(
                TokenClassifierRunner(model, located, cache), self.dev
            )
            record["fused_layers"] = list(next(iter(layer.fused_layers.values())))
        return record


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
    with eval_mode(runner.model):
        try:
            for start in range(0, len(features), batch_size):
                _, labels = runner.logits(features[start : start + batch_size], torch.device("cpu"))
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
