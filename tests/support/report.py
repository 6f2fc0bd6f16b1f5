"""Figures a test wants in the run's summary (the soak's and the crash matrix's), printed by the
`pytest_terminal_summary` hook in tests/conftest.py even when output is captured."""

from __future__ import annotations

FIGURES: list[str] = []


def record(line: str) -> None:
    FIGURES.append(line)
    print(line)
