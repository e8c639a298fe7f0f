"""AdapterHub bottleneck adapters as a budget-matched baseline (optional extra ``adapters``).

``pip install "peft_layerfusion[adapters]"`` pins transformers 4.57.x (``adapters`` 1.3
requires it), so this module imports ``adapters`` lazily and only here. The baselines are
reachable through the regime names of :func:`peft_layerfusion.comparison.regimes.apply_regime`,
for the method ``"none"`` (AdapterHub cannot host a fusion module):

* ``adapter_seqbn``: Pfeiffer adapters (``SeqBnConfig``), one per block;
* ``adapter_double_seqbn``: Houlsby adapters (``DoubleSeqBnConfig``), two per block.

Size them with ``reduction_factor`` or with ``match_params`` (a target count, e.g. DWAtt's
from :func:`peft_layerfusion.comparison.audit.audit`), which picks the reduction factor through
:func:`peft_layerfusion.comparison.budget.match_bottleneck`. The base is frozen; the adapters and
the task head train.

Example:
    >>> from peft_layerfusion.comparison.regimes import apply_regime
    >>> model = apply_regime(base_model, "none", "adapter_seqbn", match_params=5_408)  # DWAtt's, here
    >>> adapter_parameter_count(model), model.layerfusion_bottleneck["kind"]  # the closest count
    (5361, 'seqbn')
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from types import ModuleType
from typing import Optional

from safetensors.torch import load_file, save_file
from torch import nn

from ..config import invalid
from ..utils import atomic_write, atomic_write_json
from .budget import BOTTLENECK_KINDS, match_bottleneck

ADAPTER_NAME = "bottleneck"
SPEC_ATTR = "layerfusion_bottleneck"  # set on the model: what `load_bottleneck` must rebuild
SPEC_FILE = "bottleneck_adapters.json"
WEIGHTS_FILE = "bottleneck_adapters.safetensors"  # the trainable tensors: adapters + head
CONFIG_CLASSES = {"seqbn": "SeqBnConfig", "double_seqbn": "DoubleSeqBnConfig"}
ADAPTERS_VERSION = "1.3.0"  # the `adapters` extra of pyproject.toml


def require_adapters() -> ModuleType:
    """Import AdapterHub's ``adapters``, or fail saying which stack it needs and how to install it.

    Raises:
        ImportError: one line naming the stack (``adapters`` 1.3.0 on transformers 4.57.x), the
            transformers of this environment, the import error, and the install command.

    Example:
        >>> adapters = require_adapters()
    """
    try:
        return importlib.import_module("adapters")
    except ImportError as error:
        found = metadata.version("transformers")  # a dependency of this package: always there
        raise ImportError(
            f"The bottleneck-adapter baselines need AdapterHub's `adapters` {ADAPTERS_VERSION}, which pins "
            f"transformers 4.57.x (this environment has transformers {found}; importing `adapters` "
            f'failed: {error}): install both in a fresh environment with `pip install "peft_layerfusion'
            f'[adapters]"` (transformers==4.57.6, adapters=={ADAPTERS_VERSION}).'
        ) from error


def apply_bottleneck_adapters(
    model: nn.Module,
    kind: str = "seqbn",
    *,
    reduction_factor: Optional[float] = None,
    match_params: Optional[int] = None,
    head_modules: Sequence[str] = ("classifier",),
) -> nn.Module:
    """Add one trainable bottleneck adapter setup to ``model`` and freeze everything else.

    Args:
        model: A transformers model of a type AdapterHub supports (modified in place).
        kind: ``"seqbn"`` (Pfeiffer) or ``"double_seqbn"`` (Houlsby).
        reduction_factor: Bottleneck width is ``d // reduction_factor`` (default 16).
        match_params: Instead of ``reduction_factor``: size the adapters to this count.
        head_modules: Modules that train besides the adapters (the task head).

    Returns:
        ``model`` itself, with adapters active and trainable.

    Example:
        >>> model = apply_bottleneck_adapters(base_model, "double_seqbn", reduction_factor=8)  # d 32: 4 wide
        >>> model is base_model, adapter_parameter_count(model)  # 2 adapters in each of the 3 blocks
        (True, 1752)
        >>> sorted({name.split(".")[0] for name, p in model.named_parameters() if p.requires_grad})
        ['bert', 'classifier']
    """
    if kind not in BOTTLENECK_KINDS:
        raise invalid("kind", kind, f"one of {list(BOTTLENECK_KINDS)}")
    if reduction_factor is not None and match_params is not None:
        raise invalid("reduction_factor", reduction_factor, "None when `match_params` is given")
    if match_params is not None:
        reduction_factor = match_bottleneck(model, match_params, kind).value
    adapters = require_adapters()
    adapters.init(model)
    config = getattr(adapters, CONFIG_CLASSES[kind])(reduction_factor=reduction_factor or 16)
    model.add_adapter(ADAPTER_NAME, config=config)
    with quiet_logger("adapters.model_mixin"):  # "none are activated": train_adapter resets, then activates
        model.train_adapter(ADAPTER_NAME)
    for name, param in model.named_parameters():  # exactly: adapters + head
        is_head = any(name == h or name.startswith(f"{h}.") for h in head_modules)
        param.requires_grad_(is_head or is_adapter_parameter(name))
    spec = {
        "kind": kind,
        "reduction_factor": float(config["reduction_factor"]),
        "head_modules": list(head_modules),
    }
    setattr(model, SPEC_ATTR, spec)
    return model


@contextmanager
def quiet_logger(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Inside the block the stdlib logger ``name`` reports only ``level`` and above.

    Args:
        name: The logger, e.g. ``"adapters.model_mixin"``.
        level: The lowest level still reported.

    Example:
        >>> import logging
        >>> with quiet_logger("adapters.model_mixin"):  # e.g. around model.train_adapter("bottleneck")
        ...     logging.getLogger("adapters.model_mixin").isEnabledFor(logging.WARNING)
        False
        >>> logging.getLogger("adapters.model_mixin").isEnabledFor(logging.WARNING)  # as before
        True
    """
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def is_adapter_parameter(name: str) -> bool:
    """Whether the parameter ``name`` belongs to the adapters :func:`apply_bottleneck_adapters` adds.

    Example:
        >>> is_adapter_parameter("bert.encoder.layer.0.output.adapters.bottleneck.adapter_down.0.weight")
        True
    """
    return f".{ADAPTER_NAME}." in name


def adapter_parameter_count(model: nn.Module) -> int:
    """New parameters of the adapters of ``model`` (the head excluded), as ``budget`` counts them.

    Example:
        >>> adapter_parameter_count(apply_bottleneck_adapters(base_model, reduction_factor=16))  # d 32: 2
        486
    """
    return sum(param.numel() for name, param in model.named_parameters() if is_adapter_parameter(name))


def save_bottleneck(model: nn.Module, directory: str | os.PathLike) -> None:
    """Save the adapters and the head of a model from :func:`apply_bottleneck_adapters`.

    Writes ``SPEC_FILE`` (kind, reduction factor, head) and ``WEIGHTS_FILE`` (every
    trainable tensor), each atomically.

    Example:
        >>> save_bottleneck(apply_bottleneck_adapters(base_model, "seqbn"), "out/seqbn")  # once trained
        >>> sorted(os.listdir("out/seqbn"))
        ['bottleneck_adapters.json', 'bottleneck_adapters.safetensors']
    """
    spec = getattr(model, SPEC_ATTR, None)
    if spec is None:
        raise ValueError("This model has no bottleneck adapters from `apply_bottleneck_adapters`.")
    os.makedirs(directory, exist_ok=True)
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    atomic_write(os.path.join(directory, WEIGHTS_FILE), lambda path: save_file(tensors, path))
    atomic_write_json(os.path.join(directory, SPEC_FILE), spec, indent=None)


def load_bottleneck(base_model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Rebuild on ``base_model`` (the same pretrained model) what :func:`save_bottleneck` wrote.

    Example:
        >>> from transformers import AutoModelForTokenClassification
        >>> def pretrained():  # a fresh copy of the pretrained model (a random head each time)
        ...     return AutoModelForTokenClassification.from_pretrained(model_path, num_labels=5)
        >>> trained = apply_bottleneck_adapters(pretrained(), "seqbn").eval()
        >>> save_bottleneck(trained, "out/seqbn")
        >>> model = load_bottleneck(pretrained(), "out/seqbn")
        >>> batch = torch.tensor([[2, 10, 11, 12, 3]])
        >>> torch.equal(model(batch).logits, trained(batch).logits)  # the adapters and the head restored
        True
    """
    with open(os.path.join(directory, SPEC_FILE)) as handle:
        spec = json.load(handle)
    model = apply_bottleneck_adapters(
        base_model, spec["kind"], reduction_factor=spec["reduction_factor"], head_modules=spec["head_modules"]
    )
    saved = load_file(os.path.join(directory, WEIGHTS_FILE))
    unexpected = model.load_state_dict(saved, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"{directory} holds tensors this model does not have: {unexpected[:5]}")
    return model.eval()  # `train_adapter` switched to training mode; loading is for inference
