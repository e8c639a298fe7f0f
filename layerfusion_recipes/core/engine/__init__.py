"""One experiment and its runs: the task's settings and experiment, one training loop (a lone LR or
``K`` stacked LR candidates), the forward passes, the processes that share a sweep's runs."""
