"""Model cards for saved adapters: whoever loads one learns it needs ``import peft_layerfusion``.

peft writes ``README.md`` next to every adapter it saves, in
``PeftModel.create_or_update_model_card(output_dir)`` (called by ``save_pretrained``, hence
by ``push_to_hub`` and transformers' ``Trainer``). That card knows nothing of this package,
and an adapter of ours loaded without ``import peft_layerfusion`` fails inside peft with a
bare ``KeyError: 'DWATT'`` (peft looks the ``peft_type`` of ``adapter_config.json`` up in its
registry before it reads anything else, so no field of that file can carry a hint).

:func:`install_card_hook` (called by ``registration.register_all``) wraps that method once:
peft writes its card as usual, then, when any saved adapter is ours, :func:`update_model_card`
adds the metadata (``library_name: peft``, ``base_model``, tags ``peft_layerfusion`` and the
method) and ONE section between :data:`SECTION_BEGIN` and :data:`SECTION_END`: the package,
each adapter's method, the base model and the load, ``import peft_layerfusion`` first. The
rest of the card (a user's own text and tags) is kept; saving again replaces the section. An adapter
that peft saves in a sub-folder of its own (any adapter not named ``default``) gets a ``README.md``
there too, with its own section, so the folder a user loads from says it.

Example:
    >>> from peft_layerfusion import DWAttConfig
    >>> model = get_peft_model(base_model, DWAttConfig(task_type="TOKEN_CLS"))
    >>> model.save_pretrained("adapter")  # adapter/README.md names peft_layerfusion and DWATT
    >>> "peft_layerfusion" in open("adapter/README.md").read()
    True
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Iterable, Mapping

from huggingface_hub import ModelCard
from peft import PeftConfig, PeftModel

from .bitfit import BitFitConfig
from .config import LayerFusionConfig
from .names import entry_named
from .utils import atomic_write_text

LIBRARY_TAG = "peft_layerfusion"
SECTION_BEGIN = "<!-- peft_layerfusion: begin (rewritten on every save_pretrained) -->"
SECTION_END = "<!-- peft_layerfusion: end -->"
ADAPTER_PLACEHOLDER = "path/to/this/adapter"  # the card cannot know where it will be read from
_HOOK_MARK = "_peft_layerfusion_card_hook"


def is_layerfusion_config(config: PeftConfig) -> bool:
    """Whether ``config`` is one of this package's PEFT types (a fusion method or BitFit)."""
    return isinstance(config, (LayerFusionConfig, BitFitConfig))


def method_description(config: PeftConfig) -> str:
    """One line on the method: the first line of its config's docstring, in Markdown; for a config with
    the values of one of its method's presets, that preset's summary and name first.

    Example:
        >>> from peft_layerfusion import DWAttConfig, ScalarMixConfig
        >>> method_description(DWAttConfig())
        'DWAtt (depth-wise attention). Paper defaults throughout.'
        >>> method_description(ScalarMixConfig.from_preset("layer_mix"))[:41]
        'LayerMix: a ScalarMix of unit-RMS states,'
    """
    first_line = (type(config).__doc__ or type(config).__name__).strip().splitlines()[0]
    described = first_line.removeprefix("Configuration of ").replace("``", "`")
    for name, preset in getattr(config, "PRESETS", {}).items():
        if all(getattr(config, field) == value for field, value in preset.values.items()):
            return f"{entry_named(name).summary} (the preset `{name}`). {described}"
    return described


def _also_saved(config: PeftConfig, module_names: Collection[str] | None = None) -> str:
    """What the adapter holds besides its fusion module: LoRA, biases, whole modules.

    ``modules_to_save`` entries that match no module of ``module_names`` (peft's task types
    list ``score`` next to ``classifier``) are left out when ``module_names`` is given.
    """
    parts = []
    targets = config.target_modules
    if targets:
        names = [targets] if isinstance(targets, str) else sorted(targets)
        parts.append(f"LoRA (r={config.r}) on {', '.join(f'`{name}`' for name in names)}")
    if config.bias != "none":
        parts.append(f"biases (`bias={config.bias!r}`)")
    saved = [
        name
        for name in config.modules_to_save or []
        if module_names is None or any(m == name or m.endswith(f".{name}") for m in module_names)
    ]
    if saved:
        parts.append(", ".join(f"`{name}`" for name in saved))
    return "; ".join(parts) or "-"


def _base_model_line(
    class_name: str, transformers_class: bool, base_name: str, num_labels: int | None
) -> str:
    """The line of the snippet that builds the base model."""
    if not base_name:
        return f"base_model = ...  # a {class_name} like the one it was trained on (name not recorded)"
    if not transformers_class:
        return f"base_model = ...  # the {class_name} {base_name!r}"
    labels = f", num_labels={num_labels}" if num_labels is not None else ""
    return f"base_model = {class_name}.from_pretrained({base_name!r}{labels})"


def card_section(
    configs: Mapping[str, PeftConfig],
    base_name: str,
    base_class: type,
    num_labels: int | None = None,
    module_names: Collection[str] | None = None,
    in_own_folder: bool = False,
) -> str:
    """The card's peft_layerfusion section, markers included.

    Args:
        configs: The adapters of this package, by adapter name.
        base_name: The base model's name or path (``""`` when it was built in memory).
        base_class: The base model's class (e.g. ``BertForTokenClassification``).
        num_labels: The head's number of labels, shown in the load when the head is a
            classifier (``None`` to leave it out).
        module_names: The base model's module names, to list only the ``modules_to_save``
            that exist (``None``: list them all).
        in_own_folder: The section of one adapter's own sub-folder (no note on sub-folders).

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> from transformers import BertForTokenClassification
        >>> print(card_section({"default": DWAttConfig()}, "bert-base-cased", BertForTokenClassification, 9))
        <!-- peft_layerfusion: begin (rewritten on every save_pretrained) -->
        ## peft_layerfusion adapter
        ...
        | `default` | `DWATT` | DWAtt (depth-wise attention). Paper defaults throughout. | - |
        ...
        <!-- peft_layerfusion: end -->
    """
    types = sorted({config.peft_type.value for config in configs.values()})
    class_name = base_class.__name__
    transformers_class = base_class.__module__.startswith("transformers.")
    rows = [
        f"| `{name}` | `{config.peft_type.value}` | {method_description(config)} "
        f"| {_also_saved(config, module_names)} |"
        for name, config in configs.items()
    ]
    snippet = [
        f"import peft_layerfusion  # first: registers {', '.join(types)} with peft",
        "from peft import PeftModel",
        *([f"from transformers import {class_name}"] if transformers_class and base_name else []),
        "",
        _base_model_line(class_name, transformers_class, base_name, num_labels),
        f'model = PeftModel.from_pretrained(base_model, "{ADAPTER_PLACEHOLDER}")  # this folder or Hub id',
    ]
    named = [name for name in configs if name != "default" and not in_own_folder]
    lines = [
        SECTION_BEGIN,
        "## peft_layerfusion adapter",
        "",
        f"This adapter was made with `{LIBRARY_TAG}` (layer fusion methods as PEFT tuner types); "
        f"loading it needs that package installed, and `import {LIBRARY_TAG}` before the load (without it "
        f"peft fails with `KeyError: '{types[0]}'`).",
        "",
        "| adapter | PEFT type | method | also saved with it |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Base model: `{base_name}` (`{class_name}`)."
        if base_name
        else f"Base model: a `{class_name}` built in memory (no name or path recorded).",
        "",
        "### How to load",
        "",
        f"`import peft_layerfusion` must come first: it registers {', '.join(f'`{t}`' for t in types)} "
        "with peft. Without it, `PeftModel.from_pretrained` and transformers' `model.load_adapter` "
        f"fail with `KeyError: '{types[0]}'`.",
        "",
        "```python",
        *snippet,
        "```",
    ]
    if named:
        lines += [
            "",
            "Adapters other than `default` are in sub-folders of the same name: "
            f'`model.load_adapter("{ADAPTER_PLACEHOLDER}/{named[0]}", adapter_name="{named[0]}")`.',
        ]
    return "\n".join([*lines, SECTION_END])


def with_section(text: str, section: str) -> str:
    """``text`` with ``section`` in place of an earlier one, else right after the first ``# `` title.

    Example:
        >>> with_section("# My model\\n\\nMine.", "S")
        '# My model\\n\\nS\\n\\nMine.'
    """
    begin, end = text.find(SECTION_BEGIN), text.find(SECTION_END)
    if begin != -1 and end > begin:
        return text[:begin] + section + text[end + len(SECTION_END) :]
    lines = text.split("\n")
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if title is None:
        return f"{section}\n\n{text.lstrip()}"
    head, rest = "\n".join(lines[: title + 1]), "\n".join(lines[title + 1 :]).lstrip("\n")
    return f"{head}\n\n{section}\n\n{rest}"


def _read_tags(output_dir: str) -> list[str]:
    path = os.path.join(output_dir, "README.md")
    if not os.path.exists(path):
        return []
    return list(ModelCard.load(path).data.tags or [])


def update_model_card(model: PeftModel, output_dir: str, previous_tags: Iterable[str] = ()) -> bool:
    """Add the peft_layerfusion metadata and section to ``output_dir/README.md`` (peft's card).

    Does nothing (returns ``False``) when no adapter of ``model`` is of this package. Tags
    the card had before peft rewrote them (``previous_tags``) are kept.

    Args:
        model: The PeftModel being saved.
        output_dir: The folder it is saved to; ``README.md`` there must exist.
        previous_tags: The card's tags before peft's update.

    Example:
        >>> model.save_pretrained("adapter")  # save_pretrained calls it
        >>> update_model_card(model, "adapter")  # the section is rewritten, the rest of the card kept
        True
    """
    ours = _our_adapters(model)
    if not ours:
        return False
    path = os.path.join(output_dir, "README.md")
    card = ModelCard.load(path)
    base_name = _base_name(model, ours)
    card.data.library_name = "peft"
    if base_name:
        card.data.base_model = base_name
    elif not card.data.base_model:  # peft writes '' (and a tag 'base_model:adapter:') for in-memory models
        card.data.base_model = None
    methods = {config.peft_type.value.lower() for config in ours.values()}
    tags = set(previous_tags) | set(card.data.tags or []) | methods | {LIBRARY_TAG}
    card.data.tags = sorted(tag for tag in tags if tag != "base_model:adapter:")
    card.text = with_section(card.text, _section(model, ours))
    atomic_write_text(path, str(card))
    return True


def update_folder_cards(model: PeftModel, save_directory: str) -> list[str]:
    """Write the section of each adapter of ours that peft saved in a sub-folder of ``save_directory``
    (any adapter not named ``default``) into that folder's ``README.md``, which the folder a user
    loads from then holds; return the folders written.

    Example:
        >>> from peft_layerfusion import DWAttConfig
        >>> model.add_adapter("other", DWAttConfig(task_type="TOKEN_CLS"))
        >>> model.save_pretrained("adapter")  # save_pretrained calls it
        >>> update_folder_cards(model, "adapter")
        ['adapter/other']
    """
    written = []
    for name, config in _our_adapters(model).items():
        folder = os.path.join(save_directory, name)
        if name == "default" or not os.path.isfile(os.path.join(folder, "adapter_config.json")):
            continue
        readme = os.path.join(folder, "README.md")
        text = open(readme, encoding="utf-8").read() if os.path.exists(readme) else f"# {name}\n"
        atomic_write_text(readme, with_section(text, _section(model, {name: config}, in_own_folder=True)))
        written.append(folder)
    return written


def _our_adapters(model: PeftModel) -> dict[str, PeftConfig]:
    return {name: config for name, config in model.peft_config.items() if is_layerfusion_config(config)}


def _base_name(model: PeftModel, ours: Mapping[str, PeftConfig]) -> str:
    """The base model's name or path, else one an adapter's config recorded, else ``""``."""
    named = getattr(model.get_base_model(), "name_or_path", "")
    return named or next((c.base_model_name_or_path for c in ours.values() if c.base_model_name_or_path), "")


def _section(model: PeftModel, configs: Mapping[str, PeftConfig], in_own_folder: bool = False) -> str:
    """:func:`card_section` of ``configs`` for the base model of ``model``."""
    base = model.get_base_model()
    classifier = type(base).__name__.endswith("Classification")
    num_labels = getattr(getattr(base, "config", None), "num_labels", None) if classifier else None
    module_names = [name for name, _ in base.named_modules()]
    return card_section(
        configs, _base_name(model, configs), type(base), num_labels, module_names, in_own_folder=in_own_folder
    )


def install_card_hook() -> None:
    """Make ``PeftModel.create_or_update_model_card`` also call :func:`update_model_card`, and
    ``PeftModel.save_pretrained`` :func:`update_folder_cards` (idempotent)."""
    original: Callable[[PeftModel, str], None] = PeftModel.create_or_update_model_card
    if not getattr(original, _HOOK_MARK, False):

        @functools.wraps(original)
        def create_or_update_model_card(self: PeftModel, output_dir: str) -> None:
            previous_tags = _read_tags(output_dir)
            original(self, output_dir)
            update_model_card(self, output_dir, previous_tags)

        setattr(create_or_update_model_card, _HOOK_MARK, True)
        PeftModel.create_or_update_model_card = create_or_update_model_card
    save: Callable[..., None] = PeftModel.save_pretrained
    if not getattr(save, _HOOK_MARK, False):

        @functools.wraps(save)
        def save_pretrained(self: PeftModel, save_directory: str, *args: object, **kwargs: object) -> None:
            save(self, save_directory, *args, **kwargs)
            if kwargs.get("is_main_process", True):  # peft has written the adapters' folders
                update_folder_cards(self, save_directory)

        setattr(save_pretrained, _HOOK_MARK, True)
        PeftModel.save_pretrained = save_pretrained
