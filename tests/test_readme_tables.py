"""The README's config tables are what ``conf/`` holds (``python -m src.utils.config_tables --write``
regenerates them)."""

from __future__ import annotations

import pytest

from src.utils.config_tables import README, options, render


def test_readme_tables_match_conf() -> None:
    text = README.read_text()
    assert render(text) == text, "README tables drifted from conf/: python -m src.utils.config_tables --write"


@pytest.mark.parametrize("group", ["data", "model", "experiment", "trainer"])
def test_every_option_is_listed(group: str) -> None:
    text = README.read_text()
    for option in options(group):
        assert f"`{option}`" in text, f"{group}={option} is not in README.md"

