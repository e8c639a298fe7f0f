"""The options, standard library only (the command line reads them before any heavy import): shared
values and checks, the few-shot options every task shares, the default grids, the names ``--model``
takes and where data and models come from, the registry's names."""
