"""What every task shares, in rooms, each importing only the rooms below it: ``sweeps`` (a grid of
runs) over ``engine`` (one experiment's runs) over ``probes`` over ``cache`` over ``results`` (records,
cells, selection, statistics) over ``models`` over ``options`` (standard library only); beneath them
all, ``errors``, ``batches`` and ``memory``."""
