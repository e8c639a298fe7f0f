"""Sweeps over ``accelerate launch`` processes: each process trains its share of the runs, alone.

Under ``accelerate launch --num_processes N`` every process runs the same command. A sweep
divides its units (a cell and its LRs) among them (:func:`share`): each unit is trained by one
process, on that process's device, with the full batch and no data parallelism
(:func:`~layerfusion_recipes.ner.training.prepare_local`), so every record has the same key and the
same F1 as in a one-process run; records are written once each (the results file is safe for
concurrent writers) and only the main process writes the table and figures.

A launch that accelerate cannot set up is refused (:func:`process_state`): e.g. ``accelerate
launch --multi_gpu --num_processes 2`` on a machine without GPUs starts 2 processes, but each
believes it is alone and would run every cell. On CPU launch with ``ACCELERATE_USE_CPU=1``::

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m layerfusion_recipes.cli ner ...

(``accelerate launch --cpu --num_processes 2`` starts one process: correct, not parallel).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

from ..errors import UserError

T = TypeVar("T")

# where launchers put the number of processes they started (torchrun, MPI), as accelerate reads it
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes(environ: dict[str, str] | None = None) -> int:
    """How many processes the launcher says it started (1 without a launcher).

    Example:
        >>> launched_processes({"WORLD_SIZE": "2"}), launched_processes({})
        (2, 1)
    """
    environ = os.environ if environ is None else environ
    for name in WORLD_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def process_state() -> Any:
    """accelerate's ``PartialState`` as ``Accelerator()`` sets it up (``ACCELERATE_USE_CPU``), checked.

    Returns:
        The state: ``num_processes``, ``process_index``, ``device``, ``wait_for_everyone()``.

    Raises:
        UserError: The launcher started several processes but accelerate set each one up alone.

    Example:
        >>> state = process_state()
        >>> state.num_processes, state.process_index
        (1, 0)
    """
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    launched = launched_processes()
    if launched > 1 and state.num_processes != launched:
        raise UserError(
            f"the launcher started {launched} processes but accelerate set up {state.num_processes} "
            f"({state.distributed_type.value}, device {state.device}): each would run the whole sweep. "
            f"On CPU launch with ACCELERATE_USE_CPU=1 (ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu "
            f"--num_processes {launched} ...); on GPUs give each process a visible GPU"
        )
    return state


def share(items: Sequence[T], process_index: int, num_processes: int) -> list[T]:
    """The items of process ``process_index`` of ``num_processes``: every ``num_processes``-th one.

    Order ``items`` longest first beforehand so that the processes get similar work. Every item
    goes to exactly one process, whatever each process has already finished (filter after sharing).

    Raises:
        ValueError: ``num_processes`` below 1 or ``process_index`` outside ``0..num_processes-1``.

    Example:
        >>> share(["a", "b", "c", "d", "e"], 1, 2)
        ['b', 'd']
    """
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ValueError(
            f"process_index must be in 0..num_processes-1 and num_processes >= 1, "
            f"got process_index={process_index}, num_processes={num_processes}"
        )
    return list(items[process_index::num_processes])


def check_workers(workers: int, num_processes: int) -> None:
    """Refuse worker pools inside a multi-process launch (a spawned worker would join the launch's
    process group as its parent's rank a second time).

    Raises:
        ValueError: ``workers`` above 1 with ``num_processes`` above 1.

    Example:
        >>> check_workers(1, 4), check_workers(4, 1)
        (None, None)
    """
    if workers > 1 and num_processes > 1:
        raise ValueError(
            f"--workers {workers} under accelerate launch with {num_processes} processes: use one or the "
            f"other (--workers 1 with accelerate launch; the processes already share out the runs)"
        )
