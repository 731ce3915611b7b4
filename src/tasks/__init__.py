"""LightningModules: each wraps one task's network and owns its loss, metrics and optimisation."""
