"""The hostile suites report their counts in pytest's terminal summary (also under -q)."""

from __future__ import annotations

import pytest

LINES: list[str] = []


@pytest.fixture
def hostile_report():
    return LINES.append


def pytest_terminal_summary(terminalreporter) -> None:
    if LINES:
        terminalreporter.section("hostile input")
        for line in LINES:
            terminalreporter.write_line(line)
