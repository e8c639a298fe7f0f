"""The process's memory: what it holds resident, and giving the heap's freed pages back (standard
library only). The training loop (:mod:`~layerfusion_recipes.core.engine.fitting`), the forward passes
(:mod:`~layerfusion_recipes.core.engine.runner`) and the feature cache call it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os


def glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``malloc_trim``), else ``None`` (macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC = glibc()


def release_freed_memory() -> bool:
    """Give the pages glibc's heap holds free back to the system (``malloc_trim(0)``); ``False`` where
    the C library is not glibc (nothing to do).

    Why: a stacked FE run's tensors change size with every shuffled batch (seven DWAtt candidates,
    vmap and backward), and glibc serves such requests from its heap and keeps what they free, mostly
    in holes it cannot hand back by itself. Measured on the MiniLM CoNLL-2003 FE sweep (N = 32, two
    trials, ten epochs): in use 0.8 GB, held free 2.4 GB after one DWAtt run and still growing (peak RSS
    5.2 GB). :func:`~layerfusion_recipes.core.engine.fitting.fit` calls this after every epoch's steps and
    every evaluation, and after a training step or evaluation batch that leaves the process above its
    resident limit (:func:`resident_above`: a sweep's memory line; every one under ``--train-memory``).
    That costs time: the heap walk takes milliseconds, but the next step faults in again the pages it
    gave back (after every step and batch: 12% of a DWAtt cell's time at 13 x 768, seven candidates;
    only above the memory line: 3%). Numbers do not change.

    Example:
        >>> release_freed_memory()  # True on Linux with glibc
        True
    """
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory (RSS) in bytes, from ``/proc/self/statm``; ``None`` where it
    cannot be read (not Linux).

    Example:
        >>> resident_bytes() > 0  # e.g. 612368384
        True
    """
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def resident_above(limit: int | None) -> bool:
    """Whether this process holds more than ``limit`` bytes resident: always for ``0``, never for
    ``None`` or where the resident memory cannot be read. What
    :func:`~layerfusion_recipes.core.engine.fitting.fit` asks after every training step and evaluation batch
    before it gives the heap's freed pages back (:func:`release_freed_memory`).

    Example:
        >>> resident_above(0), resident_above(None), resident_above(2**62)
        (True, False, False)
    """
    if limit is None:
        return False
    if limit == 0:
        return True
    resident = resident_bytes()
    return resident is not None and resident > limit


def collect_garbage() -> None:
    """Free what only reference cycles keep alive (``gc.collect()``), then give the freed heap pages back
    (:func:`release_freed_memory`).

    Why: a model held in reference cycles is not freed when its last name goes but when Python's cyclic
    collector next makes a full pass, which object counts trigger, not bytes. Fusion adapters did that
    (each block's forward hook was a bound method of the fusion's capture, which held the blocks):
    R+1 on SST-2 with Gemma 3 270M, 11 runs one after another (each builds its model: about 1 GB of
    memory and 1 GB of mapped weights) peaked at 16.3 GB RSS, every earlier run's model still alive.
    The library now holds the model through weak links (``peft_layerfusion.utils.WeakLink``), so a
    run's model is freed at once; this stays as the guard against any other cycle (a callback, a
    library's cache) holding a whole model:
    :meth:`~layerfusion_recipes.core.engine.experiment.FewShotExperiment.build` calls it before it builds the
    next. Numbers do not change.

    A full pass scans every object the process tracks (0.25 s with torch, transformers and peft loaded),
    so the first call also moves what is alive then (the libraries, the data) out of the collector's
    sight (``gc.freeze()``): later calls scan what was made since, the runs' models among it.

    Example:
        >>> collect_garbage()  # before building the next run's model
    """
    gc.collect()
    if gc.get_freeze_count() == 0:
        gc.freeze()
    release_freed_memory()
