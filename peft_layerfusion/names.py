"""The registry's names as plain data: every method, preset, baseline type and regime by name, with
its label, PEFT type and one line on what it is (standard library only).

This is THE list of names. :mod:`.registration` builds its :class:`~.registration.Method` entries from
:data:`ENTRIES` (pairing each with its config and tuner classes); the regimes, the command line, the
docs' table and the recipes read their names from here. Adding a method or a preset is one line in
:data:`ENTRIES` (a new method also: its file in ``methods/`` and its classes in ``registration.py``).

Nothing here imports torch, peft or the rest of the package, so a program that only needs the names
(``layerfusion methods``, ``--help``, the check of a ``--methods`` value, the docs build) can load this
one file without running ``peft_layerfusion/__init__.py``, which imports torch (``layerfusion_recipes``
does, in its ``__init__``).

Example:
    >>> entry_named("layer_mix").peft_type, entry_named("layer_mix").variant_of
    ('SCALAR_MIX', 'scalar_mix')
    >>> METHOD_NAMES[:3]
    ('none', 'dwatt', 'concat')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Entry:
    """One registered name: a fusion method, a preset of one, or a baseline PEFT type.

    Args:
        name: Lower case, e.g. ``"dwatt"``; a method's PEFT type is ``name.upper()``.
        label: Its name in figures and tables, e.g. ``"R+n"`` for ``extra_layers``.
        summary: One line on what it is (a method's: the first line of its module's docstring).
        token_wise: ``h`` at a position depends on that position only (its fusion module's
            ``token_wise``).
        seq2seq: Acts on a decoder: needs an encoder-decoder model (its fusion module's ``seq2seq``).
        variant_of: The method this entry is a preset of (the preset is named ``name``, one of its
            config's ``PRESETS``); its configs are saved as that method's PEFT type.
        recommended: The one method the project recommends.
        fitted: Its weights are fitted in closed form on the training sample
            (``few_shot.choose`` + ``deploy``), not trained: a trained sweep leaves it out of its
            default methods (:data:`TRAINED_NAMES`).
    """

    name: str
    label: str
    summary: str
    token_wise: bool = False
    seq2seq: bool = False
    variant_of: Optional[str] = None
    recommended: bool = False
    fitted: bool = False

    @property
    def peft_type(self) -> str:
        """The PEFT type its configs are saved as (a preset's: its method's)."""
        return (self.variant_of or self.name).upper()

    @property
    def preset(self) -> Optional[str]:
        """The name of the preset this entry is, else ``None``."""
        return self.name if self.variant_of else None


# The fusion methods and their presets, in the order of every list, table and figure.
ENTRIES: tuple[Entry, ...] = (
    Entry("dwatt", "DWAtt", "DWAtt: depth-wise attention over every block's output", token_wise=True),
    Entry(
        "concat", "Concat", "Concat: one learned linear map of every fused layer's output", token_wise=True
    ),
    Entry(
        "average",
        "Average",
        "Average: the plain mean of the fused layers' outputs (no parameters)",
        token_wise=True,
    ),
    Entry(
        "scalar_mix",
        "ScalarMix",
        "ScalarMix: a softmax-normalised, scaled mix of the layers (ELMo; Bapna et al. 2018)",
        token_wise=True,
    ),
    Entry(
        "scaled_dwatt",
        "Scaled DWAtt",
        "Scaled DWAtt: depth-wise attention that keeps its spread over depth",
        token_wise=True,
        variant_of="dwatt",
    ),
    Entry(
        "layer_mix",
        "LayerMix",
        "LayerMix: a ScalarMix of unit-RMS states, its blend kept in [0, 1], the trained fusion we recommend",
        token_wise=True,
        variant_of="scalar_mix",
        recommended=True,
    ),
    Entry(
        "extra_layers",
        "R+n",
        'R+n, the "deeper baseline": n extra blocks of the base model\'s own kind on top',
    ),
    Entry(
        "probe_ensemble",
        "Probe ensemble",
        "Probe ensemble: the mean of the top-k blocks' probe scores, fitted in closed form on the "
        "training sample (few_shot.choose + deploy); trained from scratch, a Concat",
        token_wise=True,
        variant_of="concat",
        fitted=True,
    ),
    Entry(
        "stacked",
        "Stacked combiner",
        "Stacked combiner: the blocks' probe scores combined by least squares on their out-of-fold "
        "scores, fitted in closed form on the training sample (few_shot.choose + deploy); trained "
        "from scratch, a Concat",
        token_wise=True,
        variant_of="concat",
        fitted=True,
    ),
    Entry(
        "joint_probe",
        "Joint probe",
        "Joint probe: one ridge probe on every block's state (every coordinate standardized over the "
        "sample), fitted in closed form on the training sample (few_shot.choose + deploy); trained from "
        "scratch, a Concat",
        token_wise=True,
        variant_of="concat",
        fitted=True,
    ),
    Entry(
        "joint_ensemble",
        "Joint ensemble",
        "Joint ensemble: the mean of the joint probe's and the probe ensemble's scores, fitted in closed "
        "form on the training sample (few_shot.choose + deploy; the recommended recipe deploys it unless "
        "its guard picks the block); trained from scratch, a Concat",
        token_wise=True,
        variant_of="concat",
        fitted=True,
    ),
    Entry(
        "surface_fusion",
        "SurfaceFusion",
        "SurfaceFusion: the source embeddings fused into the decoder's output distribution",
        seq2seq=True,
    ),
    Entry(
        "encoder_fusion",
        "EncoderFusion",
        "EncoderFusion: transparent attention from every decoder layer to all encoder layers",
        seq2seq=True,
    ),
)
# PEFT types that are not fusion methods (no fusion module).
BASELINE_ENTRIES: tuple[Entry, ...] = (
    Entry(
        "bitfit",
        "BitFit",
        "BitFit (Ben Zaken et al., 2022) as a PEFT type: train the base model's bias terms only",
    ),
)

RECOMMENDED: str = next(entry.name for entry in ENTRIES if entry.recommended)  # the one method we recommend
ENCODER_NAMES: tuple[str, ...] = tuple(entry.name for entry in ENTRIES if not entry.seq2seq)  # any encoder
SEQ2SEQ_NAMES: tuple[str, ...] = tuple(entry.name for entry in ENTRIES if entry.seq2seq)  # encoder-decoder

# The plain last-layer head (no fusion), then every encoder method: what a regime takes as its method.
PLAIN_HEAD = "none"
PLAIN_HEAD_LABEL = "last layer (plain head)"
METHOD_NAMES: tuple[str, ...] = (PLAIN_HEAD, *ENCODER_NAMES)
# What a trained sweep runs by default: every encoder method but those fitted in closed form.
TRAINED_NAMES: tuple[str, ...] = (PLAIN_HEAD, *(e.name for e in ENTRIES if not e.seq2seq and not e.fitted))
METHOD_LABELS: dict[str, str] = {
    PLAIN_HEAD: PLAIN_HEAD_LABEL,
    **{entry.name: entry.label for entry in ENTRIES},
}

# What trains next to the method (see comparison/regimes.py); AdapterHub's only with the plain head.
REGIME_NAMES: tuple[str, ...] = ("fe", "ft", "lora", "bitfit")
ADAPTER_REGIME_NAMES: tuple[str, ...] = ("adapter_seqbn", "adapter_double_seqbn")
REGIME_LABELS: dict[str, str] = {
    "fe": "frozen encoder",
    "ft": "full fine-tuning",
    "lora": "LoRA",
    "bitfit": "BitFit",
    "adapter_seqbn": "bottleneck adapter (Pfeiffer)",
    "adapter_double_seqbn": "bottleneck adapters (Houlsby)",
}


def entry_named(name: str) -> Entry:
    """The entry of :data:`ENTRIES` (or :data:`BASELINE_ENTRIES`) called ``name``.

    Raises:
        ValueError: naming the known methods when there is none of that name.

    Example:
        >>> entry_named("extra_layers").label
        'R+n'
    """
    for entry in ENTRIES + BASELINE_ENTRIES:
        if entry.name == name:
            return entry
    raise ValueError(f"method={name!r} is not registered; allowed: {[entry.name for entry in ENTRIES]}")
