"""Kill -9 a process at chosen points while it fills the feature cache (used by test_cache_files.py).

Usage::

    PYTHONPATH=tests python tests/recipes/ner/cache_crash_driver.py MODEL_DIR ROOT POINT:N [POINT:N ...]

Imports once, then for each ``POINT:N`` forks a process that runs :data:`CELL` with its cache
in ``ROOT/POINT-N`` and sends itself SIGKILL at the N-th call of the step named by ``POINT``:

* ``compute``: the forward pass of a fill's batch, as its states are taken (nothing of that fill on
  disk; the one-sentence forward that learns the blocks' outputs does not count);
* ``write``: the shard's temporary file is half written (a torn temporary file is left);
* ``rename``: the temporary file is complete and fsync'ed but not renamed to its shard name;
* ``published``: just after the rename (the shard is complete, the process dies before going on).

Prints one JSON object ``{"POINT:N": exit status}`` (``-9``: killed at the point; ``0``: the
point was never reached; ``1``: an error).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import safetensors.torch
import torch
from conftest import toy_dataset

import layerfusion_recipes.core.cache.cache_files as files_module
import layerfusion_recipes.core.cache.feature_cache as cache_module
from layerfusion_recipes.ner.experiment import Cell, NerExperiment, NerSettings

CELL = Cell("dwatt", "fe", shots=2, epochs=2, trial=0)


def crash_settings(model: str, cache_dir: str) -> NerSettings:
    return NerSettings(model=model, data="toy", lr=3e-2, batch_size=4, cache_dir=cache_dir)


def crash_data():
    return toy_dataset(train=20, dev=6)


def _killed_at(nth: int, original, before=None, after: bool = False, when=lambda *a: True):
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        if not when(*args):
            return original(*args, **kwargs)
        calls += 1
        if calls != nth:
            return original(*args, **kwargs)
        if before is not None:
            before(*args, **kwargs)
        if after:
            original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    return wrapper


def _half_written(tensors, path, metadata=None) -> None:
    data = safetensors.torch.save(tensors, metadata=metadata)
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])


def _arm(point: str, nth: int) -> None:
    def renames_temp(source, *rest):
        return str(source).endswith(files_module.TEMP_SUFFIX)

    if point == "compute":
        cache_module._KeptRows.take = _killed_at(nth, cache_module._KeptRows.take)
    elif point == "write":
        files_module.save_file = _killed_at(nth, files_module.save_file, before=_half_written)
    elif point in ("rename", "published"):
        os.replace = _killed_at(nth, os.replace, after=point == "published", when=renames_temp)
    else:
        raise ValueError(f"unknown kill point {point!r}")


def main(model: str, root: str, points: list[str]) -> dict[str, int]:
    statuses = {}
    for spec in points:
        point, nth = spec.split(":")
        pid = os.fork()
        if pid == 0:  # the process that gets killed
            code = 0  # the point was never reached
            try:
                torch.set_num_threads(1)
                _arm(point, int(nth))
                settings = crash_settings(model, os.path.join(root, f"{point}-{nth}"))
                NerExperiment(settings, crash_data()).run(CELL)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        statuses[spec] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return statuses


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])))
