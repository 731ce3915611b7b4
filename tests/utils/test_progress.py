"""Progress lines: the count, the share done and the time left, at most every ``every_s``."""

from __future__ import annotations

import logging

from src.utils.progress import Progress


def test_the_line_says_the_share_done_and_the_time_left() -> None:
    progress = Progress("translating", total=10, count=5)
    assert progress.line(now=progress.started + 10.0) == (
        "translating: 5 of 10 (50%), 10 s, about 10 s left"
    )
    unknown = Progress("lines", count=7)
    assert unknown.line(now=unknown.started + 3.0) == "lines: 7 in 3 s"


def test_step_logs_when_the_interval_passed_and_done_closes(caplog) -> None:
    progress = Progress("segments", total=4, every_s=0.0)
    with caplog.at_level(logging.INFO, logger="src.utils.progress"):
        for _ in range(4):
            progress.step()
        progress.done()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 5 and messages[0].startswith("segments: 1 of 4 (25%), ")
    assert messages[-1].startswith("segments: 4 in ")
    quiet = Progress("segments", total=4, every_s=3600.0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="src.utils.progress"):
        quiet.step()
        quiet.done()
    assert not caplog.records  # nothing to close when nothing was said
