"""Optimisation: learning-rate schedules (built by the task configs as ``_partial_`` factories) and
gradient clipping for fused optimisers."""
