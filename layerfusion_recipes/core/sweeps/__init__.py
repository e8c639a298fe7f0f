"""A grid of runs: the sweep (resumable, worker processes, ``accelerate``), its log, which task wrote a
results file, and the true few-shot protocol (every choice from each trial's own sample)."""
