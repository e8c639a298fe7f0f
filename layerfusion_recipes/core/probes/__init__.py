"""The layer probes: the library's probe on each block output, from the feature cache, their records."""
