"""One exception root for everything PAL raises on purpose."""

from __future__ import annotations


class PalError(Exception):
    """PAL could not do what was asked."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ConfigError(PalError):
    """A PAL_* setting has a value PAL cannot use."""


class GraphError(PalError):
    """The graph is invalid; nothing was written."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid graph ({len(problems)} problem(s)):\n{lines}")


class InputError(PalError):
    """The run input is invalid; nothing was written."""


class TemplateError(PalError):
    """A template could not be rendered."""


class RunNotFound(PalError):
    """No run with that id exists."""


class ToolError(PalError):
    """A tool is unknown or returned something PAL cannot journal."""


class StorageError(PalError):
    """The journal database refused or failed an operation."""


class LeaseLost(PalError):
    """Control flow: this worker's lease generation is no longer current; its writes are fenced out."""
