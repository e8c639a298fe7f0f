"""Small helpers used across the package and its recipes: atomic files, an eval-mode context, weak
links that keep a model out of reference cycles.

Example:
    >>> atomic_write_json("out/result.json", {"f1": 0.61})
    PosixPath('out/result.json')
    >>> with eval_mode(model):
    ...     logits = model(ids).logits
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

from torch import nn

T = TypeVar("T")

FILE_MODE = 0o644  # results and figures are for others to read too (mkstemp alone gives 0600)


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Create ``path`` all at once: ``write(temporary_path)``, then ``os.replace``.

    A reader sees the old file or the new one, never a half-written one; on any error the
    temporary file is removed and the old file is left as it was.

    Args:
        path: The file to create or replace (its folder is created).
        write: Writes the content to the path it is given.

    Example:
        >>> import matplotlib.pyplot as plt
        >>> figure = plt.figure()
        >>> atomic_write("fig.png", lambda temp: figure.savefig(temp, format="png"))
        PosixPath('fig.png')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(temporary)
        os.chmod(temporary, FILE_MODE)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, payload: Any, indent: int | None = 1) -> Path:
    """Write ``payload`` as JSON to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write_text(path, json.dumps(payload, indent=indent))


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the block; every submodule's own mode is restored after.

    Restoring each submodule's flag (not only the top one) keeps frozen subtrees that a
    caller put in eval mode on purpose (e.g. a frozen encoder's dropout) as they were.

    Example:
        >>> with eval_mode(model), torch.no_grad():
        ...     logits = model(ids).logits
    """
    modes = [(sub, sub.training) for sub in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for sub, training in modes:
            sub.training = training


class WeakLink(Generic[T]):
    """A weak reference to ``target`` that a deep copy re-points at the target's copy, and that pickles.

    What an adapter puts inside a model and that points back at the model's own modules (a hook
    calling its owner, the fusion layer holding the blocks of the container it is a child of) would
    put the model in reference cycles: such a model is freed only by Python's cyclic collector,
    whose full passes follow object counts, not bytes, so a deleted model's weights can stay in
    memory for a long time. Through links the model is freed as soon as its last reference goes,
    as a plain ``transformers`` model is.

    Args:
        target: The object to link to (it must be held elsewhere: the link does not keep it alive).

    Example:
        >>> link = WeakLink(base_model.bert.encoder)
        >>> link() is base_model.bert.encoder
        True
    """

    __slots__ = ("_ref",)

    def __init__(self, target: T) -> None:
        self._ref = weakref.ref(target)

    def __call__(self) -> T:
        """The target; ``ReferenceError`` once it was freed."""
        target = self._ref()
        if target is None:
            raise ReferenceError("the module this adapter part belongs to was freed")
        return target

    @property
    def alive(self) -> bool:
        """Whether the target still exists."""
        return self._ref() is not None

    def __deepcopy__(self, memo: dict) -> WeakLink[T]:
        # the target's copy: the one the rest of the copied model holds (``memo``), or a new one
        return WeakLink(copy.deepcopy(self(), memo))

    def __reduce__(self) -> tuple:
        return WeakLink, (self(),)  # pickled with its target, linked again when loaded
