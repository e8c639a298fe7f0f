"""Small helpers used across the package and its recipes: atomic files, an eval-mode context.

Example:
    >>> atomic_write_json("out/result.json", {"f1": 0.61})
    >>> with eval_mode(model):
    ...     logits = model(ids).logits
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import nn

FILE_MODE = 0o644  # results and figures are for others to read too (mkstemp alone gives 0600)


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Create ``path`` all at once: ``write(temporary_path)``, then ``os.replace``.

    A reader sees the old file or the new one, never a half-written one; on any error the
    temporary file is removed and the old file is left as it was.

    Args:
        path: The file to create or replace (its folder is created).
        write: Writes the content to the path it is given.

    Example:
        >>> atomic_write("fig.png", lambda temp: figure.savefig(temp, format="png"))
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
