"""Progress lines for work outside Lightning's loops that can run for more than a few seconds
without other output (dynamic evaluation, translating a file): one log line at most every
``every_s`` seconds with the count, the share done and an estimate of the time left."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Counts ``what`` (e.g. "dynamic evaluation: test segments") towards ``total`` (None when
    unknown) and logs where it stands every ``every_s`` seconds, and once more at :meth:`done`
    when it logged before."""

    what: str
    total: int | None = None
    every_s: float = 10.0
    count: int = 0
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    logged: int = 0

    def step(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.info("%s", self.line(now))
            self.logged += 1

    def line(self, now: float | None = None) -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.started
        if not self.total:
            return f"{self.what}: {self.count} in {elapsed:.0f} s"
        share = self.count / self.total
        left = elapsed / share - elapsed if share > 0 else float("nan")
        return (
            f"{self.what}: {self.count} of {self.total} ({100 * share:.0f}%), {elapsed:.0f} s, "
            f"about {left:.0f} s left"
        )

    def done(self) -> None:
        if self.logged:
            elapsed = time.monotonic() - self.started
            log.info("%s: %d in %.0f s", self.what, self.count, elapsed)
