"""``docs/config.md`` is what ``conf/`` holds (``python -m src.utils.config_tables --write``
regenerates it), so a new or renamed option cannot go undocumented."""

from __future__ import annotations

import pytest

from src.utils.config_tables import CONFIG_DOC, GROUPS, options, render


def test_config_page_matches_conf() -> None:
    assert CONFIG_DOC.read_text() == render(), (
        "docs/config.md drifted from conf/: python -m src.utils.config_tables --write"
    )


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_option_is_listed(group: str) -> None:
    text = CONFIG_DOC.read_text()
    missing = [option for option in options(group) if f"| `{option}` |" not in text]
    assert not missing, f"{group}/ options missing from docs/config.md: {missing}"
