"""LightningModules: each wraps a network for one task and owns its loss, metrics and optimisation."""
