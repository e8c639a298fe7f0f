"""The settings of ``layerfusion mlm``: one dataclass built from the parsed options.

:meth:`MlmSettings.from_args` checks the method, the regime and the LR grid (one line each, before
any model or data is read) and resolves the model (the demo encoder without ``--model``); the
recipe then passes the dataclass, never the argparse namespace.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from typing import Any

from peft_layerfusion.names import METHOD_NAMES, REGIME_NAMES

from ..core.models.demo import demo_model_path
from ..core.options.grids import DEFAULT_MLM_LR_GRIDS, LrGrids, lrs_by_method
from ..core.options.options import check_names, default_output
from .options import DEFAULTS

# the options that change a run's result; with the model and the LR they are a run's `settings`
RESULT_SETTINGS = (
    "data",
    "holdout",
    "method",
    "regime",
    "epochs",
    "batch_size",
    "block_size",
    "mlm_probability",
    "max_train_blocks",
    "max_eval_blocks",
    "head_modules",
    "seed",
)


@dataclass(frozen=True)
class MlmSettings:
    """One ``layerfusion mlm`` grid: a method and a regime at every LR of its grid (:meth:`lr_grid`).

    Args:
        data: Folder of ``train.txt``/``valid.txt``/``test.txt`` or a Hub name.
        model: Masked-LM model name or path.
        method: Fusion method (``none``: the plain last layer).
        regime: Training regime (``fe``, ``ft``, ``lora``, ``bitfit``).
        lr: Each method's max LRs, as every task holds them
            (:data:`~layerfusion_recipes.core.options.grids.LrGrids`; given as one LR, several or
            ``{method: LRs}``: :func:`~layerfusion_recipes.core.options.grids.lrs_by_method`); ``method``
            left out: the regime's :data:`DEFAULT_MLM_LR_GRIDS`.
        epochs, batch_size, block_size, mlm_probability, holdout, max_train_blocks,
        max_eval_blocks, head_modules, seed: As the options of the same names.
        output: Folder of the results file (``results.jsonl``, one record per run).
    """

    data: str
    model: str
    method: str = DEFAULTS["method"]
    regime: str = DEFAULTS["regime"]
    lr: LrGrids = field(default_factory=dict)
    epochs: int = DEFAULTS["epochs"]
    batch_size: int = DEFAULTS["batch_size"]
    block_size: int = DEFAULTS["block_size"]
    mlm_probability: float = DEFAULTS["mlm_probability"]
    holdout: float = DEFAULTS["holdout"]
    max_train_blocks: int | None = None
    max_eval_blocks: int | None = None
    head_modules: tuple[str, ...] | None = None
    seed: int = DEFAULTS["seed"]
    output: str = default_output("mlm")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", lrs_by_method(self.lr, METHOD_NAMES))  # one type, as every task's
        if self.block_size < 3:  # [CLS] + at least one token + [SEP]
            raise ValueError(f"--block-size {self.block_size}: must be >= 3 ([CLS] token [SEP]), e.g. 128")
        # 0 predicts no token (perplexity exp(0 / 1) = 1.000, on which an LR would be selected)
        check_share("--mlm-probability", self.mlm_probability, "the share of tokens predicted, e.g. 0.15")
        check_share(
            "--holdout",
            self.holdout,
            "the share of valid.txt held out as dev without a train split, e.g. 0.1",
            one_allowed=False,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MlmSettings:
        """The settings of the parsed ``layerfusion mlm`` options, checked.

        Raises:
            ValueError: naming ``--method``, ``--regime`` or ``--lr`` and what is allowed.

        Example:
            >>> from layerfusion_recipes.cli import build_parser
            >>> args = build_parser().parse_args(["mlm", "--data", "wt2", "--lr", "1e-3"])
            >>> MlmSettings.from_args(args).lr_grid()
            (0.001,)
        """
        check_names("method", [args.method], METHOD_NAMES)
        check_names("regime", [args.regime], REGIME_NAMES)
        return cls(
            data=args.data,
            model=args.model or demo_model_path(),
            method=args.method,
            regime=args.regime,
            lr=args.lr,
            epochs=args.epochs,
            batch_size=args.batch_size,
            block_size=args.block_size,
            mlm_probability=args.mlm_probability,
            holdout=args.holdout,
            max_train_blocks=args.max_train_blocks,
            max_eval_blocks=args.max_eval_blocks,
            head_modules=tuple(args.head_modules) if args.head_modules else None,
            seed=args.seed,
            output=args.output,
        )

    def lr_grid(self) -> tuple[float, ...]:
        """The LRs to run, ascending: ``lr``'s for ``method``, else the regime's default grid.

        Example:
            >>> MlmSettings("wt2", "bert-base-cased", regime="ft").lr_grid() == DEFAULT_MLM_LR_GRIDS["ft"]
            True
            >>> MlmSettings("wt2", "bert-base-cased", lr=[3e-3, 1e-3, 1e-3]).lr_grid()
            (0.001, 0.003)
        """
        return self.lr.get(self.method) or DEFAULT_MLM_LR_GRIDS[self.regime]

    def run_settings(self, lr: float) -> dict[str, Any]:
        """The settings that change a run's result (:data:`RESULT_SETTINGS`, the model and the LR).

        Stored in the run's file; a file is reused only if they are equal. Existing model and data
        paths count by their absolute real path.

        Example:
            >>> settings = MlmSettings("wikitext-2", "bert-base-cased")
            >>> settings.run_settings(1e-3)["lr"]
            0.001
        """
        stored = {"model": self.model, **{name: getattr(self, name) for name in RESULT_SETTINGS}}
        for name in ("model", "data"):
            if os.path.exists(stored[name]):
                stored[name] = os.path.realpath(stored[name])
        if stored["head_modules"] is not None:
            stored["head_modules"] = list(stored["head_modules"])
        stored["lr"] = float(lr)
        return stored


def check_share(option: str, value: float, what: str, one_allowed: bool = True) -> None:
    """Raise ``ValueError`` naming ``option`` and ``value`` unless it lies in (0, 1] (or (0, 1)).

    Args:
        option: The option, for the message.
        value: Its value.
        what: What it means, for the message.
        one_allowed: Whether 1 is allowed ((0, 1] rather than (0, 1)).

    Example:
        >>> check_share("--mlm-probability", 0.0, "the share of tokens predicted, e.g. 0.15")
        Traceback (most recent call last):
        ValueError: --mlm-probability 0.0: must be in (0, 1], the share of tokens predicted, e.g. 0.15
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (number and 0 < value and (value <= 1 if one_allowed else value < 1)):
        raise ValueError(f"{option} {value!r}: must be in (0, {'1]' if one_allowed else '1)'}, {what}")
