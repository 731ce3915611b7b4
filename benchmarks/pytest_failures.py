"""pytest plugin: every failure's report appended to a file the moment it happens.

``benchmarks/gpu_visit.py`` runs the GPU tests under a deadline; a run stopped there never prints
its summary, so the failures are written as they come (``-p benchmarks.pytest_failures``, the file
named by ``PYTEST_FAILURES_FILE``). With pytest-xdist each report reaches the controlling
process too, which alone writes it.
"""

from __future__ import annotations

import os

import pytest

ENV = "PYTEST_FAILURES_FILE"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(ENV)
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a", encoding="utf-8") as file:
        file.write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n\n")
