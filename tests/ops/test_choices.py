"""Where the measured kernel choices are kept on disk (src/kernels/choices.py)."""

from __future__ import annotations

from pathlib import Path

from src.kernels import choices, environment


def test_choices_file_is_under_xdg_cache_home(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(environment.CHOICES_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert choices.store_path() == tmp_path / "xdg" / "lightnets" / "auto_choices.json"


def test_choices_file_defaults_to_the_home_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(environment.CHOICES_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert choices.store_path() == tmp_path / ".cache" / "lightnets" / "auto_choices.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: unset, as the XDG rule says
    assert choices.store_path() == tmp_path / ".cache" / "lightnets" / "auto_choices.json"


def test_choices_variable_overrides_the_cache_root(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(environment.CHOICES_ENV, str(tmp_path / "mine.json"))
    assert choices.store_path() == Path(tmp_path / "mine.json")
    monkeypatch.setenv(environment.CHOICES_ENV, "0")
    assert choices.store_path() is None
