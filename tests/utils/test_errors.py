"""A user's mistake is reported in one line, also when Hydra's instantiate wrapped it."""

from __future__ import annotations

import pytest
from hydra.errors import InstantiationException

from src.utils.config_checks import ConfigError
from src.utils.errors import EXIT_STATUS, reported_in_one_line, user_error_of


def test_the_message_alone_on_stderr_and_exit_status_2(capsys, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop, reported_in_one_line():
        try:
            raise ConfigError("data.batch_size=0: must be a positive integer")
        except ConfigError as error:  # as hydra.utils.instantiate wraps a constructor's error
            raise InstantiationException("Error in call to target 'X'") from error
    assert stop.value.code == EXIT_STATUS == 2
    assert capsys.readouterr().err == "error: data.batch_size=0: must be a positive integer\n"


def test_a_bug_keeps_its_traceback_and_the_debug_switch_keeps_every_one(monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(KeyError), reported_in_one_line():
        raise KeyError("a bug")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigError), reported_in_one_line():
        raise ConfigError("asked for the traceback")


def test_the_cause_chain_is_searched_once() -> None:
    error = ValueError("outer")
    error.__cause__ = error  # a cycle ends the search
    assert user_error_of(error) is None
