"""LightningDataModules, one per dataset. Nothing here imports models or tasks."""
