"""Fair comparisons: training regimes by name, trained checkpoints, parameter budgets, the audit.

``regimes`` (fe / ft / lora / bitfit, and AdapterHub bottleneck baselines from
``adapters_baseline``), ``checkpoints`` (save and reload any trained combination),
``budget`` (count parameters, size baselines to a budget) and ``audit`` (per-method counts
on the meta device). Nothing below this folder imports it.
"""
